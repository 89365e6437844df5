//! Finding the protected paths of a 33 000-entry workspace (the file tools' check,
//! `keel_sandbox::protected_path`, which runs the same scan as a managed command): with the
//! tree unchanged since the last scan (the cached walk: one `stat` per directory) and with
//! a directory changed before every call (a full walk, what every call cost before the
//! cache).
//!
//! Run: `cargo bench -p keel-sandbox --bench gitscan`. The tree is built under Cargo's
//! target tmp directory: 2 000 directories of 15 files, 5 nested repositories.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "benchmark harness: any failure should abort the run loudly"
)]

use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};

/// Directories in the tree, each with [`FILES_PER_DIR`] files.
const DIRS: usize = 2_000;
const FILES_PER_DIR: usize = 15;

fn build_tree(root: &Path) {
    for n in 0..DIRS {
        let dir = root.join(format!("d{}/e{}/f{n}", n % 20, n % 200));
        std::fs::create_dir_all(&dir).unwrap();
        for m in 0..FILES_PER_DIR {
            std::fs::write(dir.join(format!("file{m}.rs")), "fn f() {}\n").unwrap();
        }
    }
    for n in 0..5 {
        std::fs::create_dir_all(root.join(format!("d{n}/vendor/.git/hooks"))).unwrap();
        std::fs::write(root.join(format!("d{n}/vendor/.git/config")), "[core]\n").unwrap();
    }
}

fn protected_paths(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let root = dir.path().canonicalize().unwrap();
    build_tree(&root);
    let probe = root.join("d3/vendor/.git/hooks/pre-commit");
    assert!(keel_sandbox::protected_path(&root, &probe, None).is_some());
    // Let the tree's changes age past the racy margin, so the unchanged case is cached.
    std::thread::sleep(Duration::from_millis(2_100));
    let mut group = c.benchmark_group("sandbox/protected_path_33k_entries");
    group.sample_size(20);
    group.bench_function("unchanged_tree_cached", |bencher| {
        bencher.iter(|| black_box(keel_sandbox::protected_path(&root, &probe, None)));
    });
    let touched = root.join("d7/e7/f7");
    let mut n = 0_u64;
    group.bench_function("changed_tree_full_walk", |bencher| {
        bencher.iter(|| {
            // A new entry in one directory: the whole tree is walked again.
            n += 1;
            std::fs::write(touched.join(format!("new{n}")), "").unwrap();
            black_box(keel_sandbox::protected_path(&root, &probe, None))
        });
    });
    group.finish();
}

criterion_group!(benches, protected_paths);
criterion_main!(benches);
