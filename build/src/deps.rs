//! Reads the make-style dependency file that `nvcc -MD -MF` writes: the source and every
//! header it included, for `cargo::rerun-if-changed`.

use std::path::PathBuf;

/// The prerequisites of the rule in `text` (`target : a.cu b.h \` ...), escapes undone.
pub(crate) fn prerequisites(text: &str) -> Vec<PathBuf> {
    let joined = text.replace("\\\r\n", " ").replace("\\\n", " ");
    let mut out = Vec::new();
    for rule in joined.lines() {
        let Some(colon) = rule_colon(rule) else {
            continue;
        };
        let mut word = String::new();
        let mut chars = rule[colon + 1..].chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek().is_some_and(|n| *n == ' ' || *n == '#') => {
                    word.push(chars.next().unwrap_or(' '));
                }
                '$' if chars.peek() == Some(&'$') => {
                    chars.next();
                    word.push('$');
                }
                c if c.is_whitespace() => {
                    if !word.is_empty() {
                        out.push(PathBuf::from(std::mem::take(&mut word)));
                    }
                }
                c => word.push(c),
            }
        }
        if !word.is_empty() {
            out.push(PathBuf::from(word));
        }
    }
    out
}

/// The `:` that ends the rule's target: followed by whitespace or the end of the line (so
/// `C:\path` on Windows is not taken for it).
fn rule_colon(rule: &str) -> Option<usize> {
    let bytes = rule.as_bytes();
    (0..bytes.len())
        .find(|&i| bytes[i] == b':' && bytes.get(i + 1).is_none_or(|b| b.is_ascii_whitespace()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continuation_lines_and_escaped_spaces() {
        let d = "out/x.ptx : /a/x.cu \\\n    /usr/include/stdc-predef.h \\\n    /b/my\\ dir/common.cuh\n";
        assert_eq!(
            prerequisites(d),
            [
                "/a/x.cu",
                "/usr/include/stdc-predef.h",
                "/b/my dir/common.cuh"
            ]
            .map(PathBuf::from)
        );
    }

    #[test]
    fn a_windows_drive_is_not_the_rule_colon() {
        assert_eq!(
            prerequisites("C:\\out\\x.ptx: C:\\a\\x.cu\n"),
            [PathBuf::from("C:\\a\\x.cu")]
        );
    }
}
