//! What the user sees at the terminal, through the real binary: the progress view (live
//! on stderr and replayed by `keel log`), `--output-format json`, `-q`, the session habits
//! (`--last`, `sessions -C/--limit`, `stop`), and the boundary rules of `--approval auto`
//! and `sandboxed` (a wider boundary needs a person or the user's own rule).

mod harness;

mod boundary;
mod help;
mod sessions;
mod view;
