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
    let mut lexer = Lexer {
        chars: src.chars().collect(),
        i: 0,
        line: 1,
        line_start: true,
        comment: Vec::new(),
        comment_end: 0,
        blank_since_comment: false,
        out: Lexed::default(),
    };
    while lexer.i < lexer.chars.len() {
        lexer.step();
    }
    lexer.out
}

/// The lexer's place in the source, and the comment that may document the next token.
struct Lexer {
    chars: Vec<char>,
    i: usize,
    line: u32,
    /// Only whitespace so far on this line: a `#` here starts a directive.
    line_start: bool,
    /// The comment being collected and the line it ends on.
    comment: Vec<String>,
    comment_end: u32,
    blank_since_comment: bool,
    out: Lexed,
}

impl Lexer {
    /// The character `k` places on, if any.
    fn peek(&self, k: usize) -> Option<&char> {
        self.chars.get(self.i + k)
    }

    /// Reads one newline, whitespace character, comment, directive or token.
    fn step(&mut self) {
        let c = self.chars[self.i];
        if c == '\n' {
            if self.line_start && self.comment_end != self.line {
                // A line with nothing on it: the comment above is not about what follows.
                self.blank_since_comment = true;
            }
            self.line += 1;
            self.i += 1;
            self.line_start = true;
        } else if c.is_whitespace() {
            self.i += 1;
        } else if c == '/' && self.peek(1) == Some(&'/') {
            self.line_comment();
        } else if c == '/' && self.peek(1) == Some(&'*') {
            self.block_comment();
        } else if c == '#' && self.line_start {
            self.directive();
        } else {
            self.token(c);
        }
    }

    /// `// ..` to the end of the line.
    fn line_comment(&mut self) {
        let chars = &self.chars;
        let start = self.i + 2;
        while self.i < chars.len() && chars[self.i] != '\n' {
            self.i += 1;
        }
        let text: String = chars[start..self.i].iter().collect();
        if !self.line_start {
            // After code on the same line: about that code, not what follows.
            self.comment.clear();
            return;
        }
        if self.blank_since_comment || self.comment_end + 1 < self.line {
            self.comment.clear();
        }
        self.comment.push(
            text.strip_prefix(' ')
                .unwrap_or(&text)
                .trim_end()
                .to_string(),
        );
        self.comment_end = self.line;
        self.blank_since_comment = false;
    }

    /// `/* .. */`, its lines stripped of leading `*`s.
    fn block_comment(&mut self) {
        let chars = &self.chars;
        let start = self.i + 2;
        self.i += 2;
        while self.i < chars.len() && !(chars[self.i] == '*' && chars.get(self.i + 1) == Some(&'/'))
        {
            if chars[self.i] == '\n' {
                self.line += 1;
            }
            self.i += 1;
        }
        let text: String = chars[start..self.i.min(chars.len())].iter().collect();
        self.i = (self.i + 2).min(chars.len());
        self.comment.clear();
        if !self.line_start {
            return;
        }
        for l in text.lines() {
            let l = l.trim();
            let l = l.strip_prefix('*').map(str::trim_start).unwrap_or(l);
            if !l.is_empty() {
                self.comment.push(l.to_string());
            }
        }
        self.comment_end = self.line;
        self.blank_since_comment = false;
    }

    /// A directive runs to the end of the line, backslash-newlines included.
    fn directive(&mut self) {
        let chars = &self.chars;
        let start = self.i;
        while self.i < chars.len() && chars[self.i] != '\n' {
            if chars[self.i] == '\\' && chars.get(self.i + 1) == Some(&'\n') {
                self.line += 1;
                self.i += 1;
            }
            self.i += 1;
        }
        let text: String = chars[start..self.i].iter().collect();
        if let Some(name) = quoted_include(&text) {
            self.out.includes.push((name, self.line));
        }
        self.comment.clear();
    }

    /// A token starting with `c`, with the comment just above it, if any.
    fn token(&mut self, c: char) {
        self.line_start = false;
        let tok_line = self.line;
        let tok = if c.is_ascii_alphabetic() || c == '_' {
            self.ident()
        } else if c.is_ascii_digit() || (c == '.' && self.peek(1).is_some_and(char::is_ascii_digit))
        {
            self.number()
        } else if c == '"' {
            self.string()
        } else if c == '\'' {
            self.char_literal()
        } else if c == ':' && self.peek(1) == Some(&':') {
            self.i += 2;
            Tok::Punct("::")
        } else {
            self.i += 1;
            let s = c.to_string();
            Tok::Punct(PUNCT.iter().find(|p| **p == s).copied().unwrap_or("?"))
        };
        let comment = if !self.comment.is_empty()
            && !self.blank_since_comment
            && self.comment_end + 1 >= tok_line
        {
            Some(self.comment.join("\n"))
        } else {
            None
        };
        self.comment.clear();
        self.blank_since_comment = false;
        self.out.tokens.push(Token {
            tok,
            line: tok_line,
            comment,
        });
    }

    fn ident(&mut self) -> Tok {
        let chars = &self.chars;
        let start = self.i;
        while self.i < chars.len()
            && (chars[self.i].is_ascii_alphanumeric() || chars[self.i] == '_')
        {
            self.i += 1;
        }
        Tok::Ident(chars[start..self.i].iter().collect())
    }

    /// A number, with its suffix, digit separators and exponent sign.
    fn number(&mut self) -> Tok {
        let chars = &self.chars;
        let start = self.i;
        while self.i < chars.len() {
            let i = self.i;
            let d = chars[i];
            let exp_sign = (d == '+' || d == '-')
                && matches!(chars[i - 1], 'e' | 'E' | 'p' | 'P')
                && !chars[start..i].starts_with(&['0', 'x']);
            if d.is_ascii_alphanumeric() || d == '.' || d == '\'' || d == '_' || exp_sign {
                self.i += 1;
            } else {
                break;
            }
        }
        Tok::Number(chars[start..self.i].iter().collect())
    }

    /// A string literal, to its closing quote or the end of the line.
    fn string(&mut self) -> Tok {
        let chars = &self.chars;
        self.i += 1;
        let start = self.i;
        while self.i < chars.len() && chars[self.i] != '"' && chars[self.i] != '\n' {
            if chars[self.i] == '\\' {
                self.i += 1;
            }
            self.i += 1;
        }
        let s: String = chars[start..self.i.min(chars.len())].iter().collect();
        self.i = (self.i + 1).min(chars.len());
        Tok::Str(s)
    }

    /// A character literal, to its closing quote or the end of the line.
    fn char_literal(&mut self) -> Tok {
        let chars = &self.chars;
        self.i += 1;
        while self.i < chars.len() && chars[self.i] != '\'' && chars[self.i] != '\n' {
            if chars[self.i] == '\\' {
                self.i += 1;
            }
            self.i += 1;
        }
        self.i = (self.i + 1).min(chars.len());
        Tok::Char
    }
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
