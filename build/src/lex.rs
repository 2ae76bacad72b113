//! A tokenizer for CUDA C, as much as the kernel parser needs: identifiers, numbers,
//! string and character literals, punctuation, with comments and preprocessor directives
//! taken out (the quoted `#include`s are kept, for typedefs in local headers) and the line
//! of every token kept, for error messages.

/// What a token is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Tok {
    Ident(String),
    Number(String),
    /// A string literal's contents, escapes as written (`"C"` is `Str("C")`).
    Str(String),
    Char,
    /// One character of punctuation, or `::`.
    Punct(&'static str),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Token {
    pub tok: Tok,
    /// 1-based.
    pub line: u32,
    /// The comment that ends on the line just above this token, with no blank line
    /// between: what a kernel's author wrote about it.
    pub comment: Option<String>,
}

impl Token {
    pub fn is_ident(&self, name: &str) -> bool {
        matches!(&self.tok, Tok::Ident(s) if s == name)
    }

    pub fn is_punct(&self, p: &str) -> bool {
        matches!(&self.tok, Tok::Punct(s) if *s == p)
    }

    pub fn ident(&self) -> Option<&str> {
        match &self.tok {
            Tok::Ident(s) => Some(s),
            _ => None,
        }
    }

    /// The token as written (roughly: literals are abbreviated).
    pub fn text(&self) -> String {
        match &self.tok {
            Tok::Ident(s) | Tok::Number(s) => s.clone(),
            Tok::Str(s) => format!("\"{s}\""),
            Tok::Char => "'.'".into(),
            Tok::Punct(p) => (*p).into(),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Lexed {
    pub tokens: Vec<Token>,
    /// `#include "name"` directives: the name and its line.
    pub includes: Vec<(String, u32)>,
}

const PUNCT: &[&str] = &[
    "(", ")", "{", "}", "[", "]", ",", ";", "*", "&", "<", ">", "=", ":", ".", "~", "!", "+", "-",
    "/", "%", "^", "|", "?", "#", "@", "$", "\\", "`",
];

pub(crate) fn lex(src: &str) -> Lexed {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Lexed::default();
    let mut i = 0;
    let mut line = 1u32;
    // Only whitespace so far on this line: a `#` here starts a directive.
    let mut line_start = true;
    // The comment being collected and the line it ends on.
    let mut comment: Vec<String> = Vec::new();
    let mut comment_end = 0u32;
    let mut blank_since_comment = false;

    let take_comment = |comment: &mut Vec<String>, end: u32, line: u32, blank: bool| {
        let c = if !comment.is_empty() && !blank && end + 1 >= line {
            Some(comment.join("\n"))
        } else {
            None
        };
        comment.clear();
        c
    };

    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            if line_start && comment_end != line {
                // A line with nothing on it: the comment above is not about what follows.
                blank_since_comment = true;
            }
            line += 1;
            i += 1;
            line_start = true;
            continue;
        }
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        if c == '/' && chars.get(i + 1) == Some(&'/') {
            let start = i + 2;
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            let text: String = chars[start..i].iter().collect();
            if !line_start {
                // After code on the same line: about that code, not what follows.
                comment.clear();
                continue;
            }
            if blank_since_comment || comment_end + 1 < line {
                comment.clear();
            }
            comment.push(
                text.strip_prefix(' ')
                    .unwrap_or(&text)
                    .trim_end()
                    .to_string(),
            );
            comment_end = line;
            blank_since_comment = false;
            continue;
        }
        if c == '/' && chars.get(i + 1) == Some(&'*') {
            let start = i + 2;
            i += 2;
            while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                if chars[i] == '\n' {
                    line += 1;
                }
                i += 1;
            }
            let text: String = chars[start..i.min(chars.len())].iter().collect();
            i = (i + 2).min(chars.len());
            comment.clear();
            if !line_start {
                continue;
            }
            for l in text.lines() {
                let l = l.trim();
                let l = l.strip_prefix('*').map(str::trim_start).unwrap_or(l);
                if !l.is_empty() {
                    comment.push(l.to_string());
                }
            }
            comment_end = line;
            blank_since_comment = false;
            continue;
        }
        if c == '#' && line_start {
            // A directive runs to the end of the line, backslash-newlines included.
            let start = i;
            while i < chars.len() && chars[i] != '\n' {
                if chars[i] == '\\' && chars.get(i + 1) == Some(&'\n') {
                    line += 1;
                    i += 1;
                }
                i += 1;
            }
            let text: String = chars[start..i].iter().collect();
            if let Some(name) = quoted_include(&text) {
                out.includes.push((name, line));
            }
            comment.clear();
            continue;
        }
        line_start = false;
        let tok_line = line;
        let tok = if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            Tok::Ident(chars[start..i].iter().collect())
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            let start = i;
            while i < chars.len() {
                let d = chars[i];
                let exp_sign = (d == '+' || d == '-')
                    && matches!(chars[i - 1], 'e' | 'E' | 'p' | 'P')
                    && !chars[start..i].starts_with(&['0', 'x']);
                if d.is_ascii_alphanumeric() || d == '.' || d == '\'' || d == '_' || exp_sign {
                    i += 1;
                } else {
                    break;
                }
            }
            Tok::Number(chars[start..i].iter().collect())
        } else if c == '"' {
            i += 1;
            let start = i;
            while i < chars.len() && chars[i] != '"' && chars[i] != '\n' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            let s: String = chars[start..i.min(chars.len())].iter().collect();
            i = (i + 1).min(chars.len());
            Tok::Str(s)
        } else if c == '\'' {
            i += 1;
            while i < chars.len() && chars[i] != '\'' && chars[i] != '\n' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i = (i + 1).min(chars.len());
            Tok::Char
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            i += 2;
            Tok::Punct("::")
        } else {
            i += 1;
            let s = c.to_string();
            Tok::Punct(PUNCT.iter().find(|p| **p == s).copied().unwrap_or("?"))
        };
        let comment = take_comment(&mut comment, comment_end, tok_line, blank_since_comment);
        blank_since_comment = false;
        out.tokens.push(Token {
            tok,
            line: tok_line,
            comment,
        });
    }
    out
}

/// `#include "name"` (spaces allowed after `#`), not `#include <name>`.
fn quoted_include(directive: &str) -> Option<String> {
    let rest = directive.strip_prefix('#')?.trim_start();
    let rest = rest.strip_prefix("include")?.trim_start();
    let rest = rest.strip_prefix('"')?;
    let end = rest.find('"')?;
    Some(rest[..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idents(src: &str) -> Vec<String> {
        lex(src).tokens.iter().map(Token::text).collect()
    }

    #[test]
    fn comments_and_directives_are_dropped_and_lines_kept() {
        let src = "#include \"common.cuh\"\n#include <cuda_fp16.h>\n// a\n/* b\n c */ int x; // d\n#define N \\\n 3\nfloat y;";
        let l = lex(src);
        assert_eq!(l.includes, vec![("common.cuh".to_string(), 1)]);
        let toks: Vec<(String, u32)> = l.tokens.iter().map(|t| (t.text(), t.line)).collect();
        assert_eq!(
            toks,
            [
                ("int", 5),
                ("x", 5),
                (";", 5),
                ("float", 8),
                ("y", 8),
                (";", 8)
            ]
            .map(|(s, l)| (s.to_string(), l))
        );
    }

    #[test]
    fn punctuation_strings_and_numbers() {
        assert_eq!(
            idents("extern \"C\" std::size_t a[3] = 1.5e-3f;"),
            [
                "extern", "\"C\"", "std", "::", "size_t", "a", "[", "3", "]", "=", "1.5e-3f", ";"
            ]
        );
    }

    #[test]
    fn the_comment_just_above_a_token_is_attached_to_it() {
        let l = lex(
            "// not this\n\n// y <- a x + b y\n// elementwise\nextern int k;\n/* block */\nint j;\nint i;",
        );
        assert_eq!(
            l.tokens[0].comment.as_deref(),
            Some("y <- a x + b y\nelementwise")
        );
        assert_eq!(l.tokens[4].comment.as_deref(), Some("block"));
        assert_eq!(l.tokens[7].comment, None);
    }
}
