//! Path and argument patterns: lexical path normalization, `*`/`?` wildcards, and what a
//! path pattern covers (the path or one of its ancestors).

/// Lexical normalization: drops `.` and empty components, resolves `..`, and makes an
/// absolute path inside `workspace` relative to it.
pub(super) fn normalize_path(path: &str, workspace: &str) -> String {
    let workspace = workspace.trim_end_matches('/');
    let relative = match path.strip_prefix(workspace) {
        Some(rest) if !workspace.is_empty() && (rest.is_empty() || rest.starts_with('/')) => {
            rest.trim_start_matches('/')
        }
        _ => path,
    };
    let absolute = relative.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in relative.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|last| *last != "..") {
                    parts.pop();
                } else if !absolute {
                    parts.push("..");
                }
            }
            other => parts.push(other),
        }
    }
    let joined = parts.join("/");
    if absolute { format!("/{joined}") } else { joined }
}

/// `*` matches any run of bytes, `?` one byte; everything else literally.
pub(super) fn wildcard_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p] == text[t]) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            while p < pattern.len() && pattern[p] == b'*' {
                p += 1;
            }
            star = Some((p, t));
        } else if let Some((star_p, star_t)) = star {
            // The `*` swallows one more byte; matching resumes after it.
            p = star_p;
            t = star_t + 1;
            star = Some((star_p, t));
        } else {
            return false;
        }
    }
    while p < pattern.len() && pattern[p] == b'*' {
        p += 1;
    }
    p == pattern.len()
}

/// `path` normalized, borrowed when it already is (the common case in a walk).
pub(super) fn normalized(path: &str) -> std::borrow::Cow<'_, str> {
    // The empty path needs no test of its own: it splits into one empty part and is
    // returned as it is, which is what `normalize_path` makes of it too.
    let clean = !path.ends_with('/')
        && !path.contains("//")
        && path
            .split('/')
            .skip(usize::from(path.starts_with('/')))
            .all(|part| part != "." && part != "..");
    if clean {
        std::borrow::Cow::Borrowed(path)
    } else {
        std::borrow::Cow::Owned(normalize_path(path, ""))
    }
}

/// Whether `pattern` matches `path` or one of its ancestors (both normalized). The empty
/// pattern is the workspace root (`.`, `./`, the workspace's own absolute path): it covers
/// every path in it (relative, not leading out with `..`).
pub(super) fn covers(pattern: &str, path: &str) -> bool {
    if pattern.is_empty() {
        return !path.starts_with('/') && path != ".." && !path.starts_with("../");
    }
    if wildcard_match(pattern.as_bytes(), path.as_bytes()) {
        return true;
    }
    path.match_indices('/').any(|(index, _)| {
        index > 0 && wildcard_match(pattern.as_bytes(), &path.as_bytes()[..index])
    })
}
