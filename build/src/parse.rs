//! Finds the `extern "C" __global__` kernels of a source and reads their signatures,
//! and the typedefs and structs that a header or source declares.
//!
//! This is not a C++ parser: it reads declarations at the shape CUDA kernels have. A
//! kernel is a definition (with a body) of a `__global__` function with C linkage, either
//! `extern "C" __global__ void name(..) {..}` or inside an `extern "C" { .. }` block.
//! Attributes with arguments (`__launch_bounds__(..)`, `__maxnreg__(..)`,
//! `__cluster_dims__(..)`, `__attribute__((..))`) are skipped wherever they stand. Kernels
//! without C linkage are ignored: their names are mangled, and templates cannot have C
//! linkage at all.

use std::collections::BTreeMap;

use crate::lex::{Tok, Token};

/// A kernel's signature as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KernelSig {
    pub name: String,
    pub line: u32,
    pub params: Vec<ParamSig>,
    /// The comment just above the declaration, if any.
    pub comment: Option<String>,
    /// The line the comment ends on: the one above the declaration.
    pub comment_end: u32,
}

impl KernelSig {
    /// `__global__ void name(params)`, one line, for documentation.
    pub fn signature(&self) -> String {
        let params: Vec<&str> = self.params.iter().map(|p| p.text.as_str()).collect();
        format!("__global__ void {}({})", self.name, params.join(", "))
    }
}

/// One parameter as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ParamSig {
    /// `None` for an unnamed parameter.
    pub name: Option<String>,
    pub line: u32,
    /// The type's words without qualifiers, `::` paths joined: `["unsigned", "int"]`,
    /// `["std::size_t"]`, `["BranchIn"]`.
    pub words: Vec<String>,
    /// How many `*`.
    pub stars: usize,
    /// `const` before the first `*`: the pointee is read-only.
    pub pointee_const: bool,
    /// The type, qualifiers but `__restrict__` kept: `const float*`, `unsigned`.
    pub c_type: String,
    /// The whole parameter as written, one line: `const float* __restrict__ x`.
    pub text: String,
}

/// A problem at a line of a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ParseError {
    pub line: u32,
    pub message: String,
}

/// Where a struct or typedef is declared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Typedef {
    pub words: Vec<String>,
    pub stars: usize,
    pub line: u32,
}

/// What a file declares that a kernel signature can name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Declared {
    /// `typedef unsigned long long u64;`, `using u64 = unsigned long long;`.
    pub typedefs: BTreeMap<String, Typedef>,
    /// `struct Name { .. }` and `typedef struct { .. } Name;`: name and line.
    pub structs: BTreeMap<String, u32>,
    /// The structs among them that hold one array of pointers and nothing else.
    pub tables: BTreeMap<String, PtrTableDecl>,
}

/// `struct BranchIn { const float* p[MAX_BRANCHES]; }`: a struct that holds one array of
/// device pointers, which a launcher can fill from a slice of buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PtrTableDecl {
    /// The pointee's type words (`float`).
    pub words: Vec<String>,
    pub pointee_const: bool,
    /// The array's length as written: a decimal literal or a `#define`'s name.
    pub slots: String,
}

/// Attribute-like words that take a parenthesised argument list and are not the
/// kernel's name.
const ATTRIBUTES_WITH_ARGS: &[&str] = &[
    "__launch_bounds__",
    "__maxnreg__",
    "__cluster_dims__",
    "__attribute__",
    "__declspec",
    "__align__",
    "alignas",
    "noexcept",
];

/// Words that qualify a parameter's type without changing its size or how it is passed.
const QUALIFIERS: &[&str] = &[
    "const",
    "volatile",
    "__restrict__",
    "__restrict",
    "restrict",
    "__grid_constant__",
    "struct",
    "class",
    "union",
    "enum",
];

/// The built-in type words: a parameter whose last word is one of these has no name.
pub(crate) const BUILTIN_WORDS: &[&str] = &[
    "void", "bool", "char", "short", "int", "long", "float", "double", "signed", "unsigned",
];

/// Every kernel defined with C linkage in `tokens`, and the signatures that could not be
/// read.
pub(crate) fn kernels(tokens: &[Token]) -> (Vec<KernelSig>, Vec<ParseError>) {
    let mut kernels = Vec::new();
    let mut errors = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i].is_ident("extern")
            && matches!(tokens.get(i + 1).map(|t| &t.tok), Some(Tok::Str(s)) if s == "C")
        {
            i += 2;
            if tokens.get(i).is_some_and(|t| t.is_punct("{")) {
                // An `extern "C" { .. }` block: declarations until its closing brace.
                i += 1;
                while i < tokens.len() && !tokens[i].is_punct("}") {
                    let comment = (tokens[i].comment.clone(), tokens[i].line.saturating_sub(1));
                    i = declaration(tokens, i, comment, &mut kernels, &mut errors);
                }
                i += 1;
            } else {
                let comment = (
                    tokens[i - 2].comment.clone(),
                    tokens[i - 2].line.saturating_sub(1),
                );
                i = declaration(tokens, i, comment, &mut kernels, &mut errors);
            }
        } else {
            i += 1;
        }
    }
    (kernels, errors)
}

/// Reads one declaration starting at `start`: up to its `;`, or through its body. Records
/// it, with `comment` (the one above it), if it is a `__global__` definition. Returns the index after it.
fn declaration(
    tokens: &[Token],
    start: usize,
    (comment, comment_end): (Option<String>, u32),
    kernels: &mut Vec<KernelSig>,
    errors: &mut Vec<ParseError>,
) -> usize {
    let mut i = start;
    let mut depth = 0usize;
    while i < tokens.len() {
        let t = &tokens[i];
        if t.is_punct("(") || t.is_punct("[") {
            depth += 1;
        } else if t.is_punct(")") || t.is_punct("]") {
            depth = depth.saturating_sub(1);
        } else if depth == 0 && (t.is_punct(";") || t.is_punct("{") || t.is_punct("}")) {
            break;
        }
        i += 1;
    }
    let head = &tokens[start..i];
    let Some(end) = tokens.get(i) else {
        return i;
    };
    if end.is_punct("}") {
        // The end of an enclosing block: the caller consumes it.
        return i;
    }
    let is_definition = end.is_punct("{");
    let after = if is_definition {
        let body_end = skip_group(tokens, i);
        // `struct X { .. };`: the `;` belongs to this declaration.
        if tokens.get(body_end).is_some_and(|t| t.is_punct(";")) {
            body_end + 1
        } else {
            body_end
        }
    } else {
        i + 1
    };
    if is_definition && head.iter().any(|t| t.is_ident("__global__")) {
        match kernel_head(head) {
            Ok(mut k) => {
                k.comment = comment;
                k.comment_end = comment_end;
                kernels.push(k);
            }
            Err(e) => errors.push(e),
        }
    }
    after
}

/// The index just after the group that opens at `open` (`(`, `[` or `{`), nesting
/// counted; the end of the tokens if it never closes.
fn skip_group(tokens: &[Token], open: usize) -> usize {
    let mut depth = 0usize;
    for (j, t) in tokens.iter().enumerate().skip(open) {
        if t.is_punct("(") || t.is_punct("[") || t.is_punct("{") {
            depth += 1;
        } else if t.is_punct(")") || t.is_punct("]") || t.is_punct("}") {
            depth -= 1;
            if depth == 0 {
                return j + 1;
            }
        }
    }
    tokens.len()
}

/// `__global__ void __launch_bounds__(256) name(params)`: the name is the last
/// identifier followed by a parenthesised list that is not an attribute.
fn kernel_head(head: &[Token]) -> Result<KernelSig, ParseError> {
    let line = head.first().map_or(0, |t| t.line);
    let mut name_at = None;
    let mut i = 0;
    while i < head.len() {
        if head[i].is_punct("(") || head[i].is_punct("[") {
            i = skip_group(head, i);
            continue;
        }
        if let Some(word) = head[i].ident()
            && head.get(i + 1).is_some_and(|t| t.is_punct("("))
            && !ATTRIBUTES_WITH_ARGS.contains(&word)
        {
            name_at = Some(i);
        }
        i += 1;
    }
    let Some(at) = name_at else {
        return Err(ParseError {
            line,
            message: format!(
                "cannot read this `__global__` declaration: no `name(parameters)` in `{}`",
                texts(head)
            ),
        });
    };
    let name = head[at].ident().unwrap_or_default().to_string();
    let close = skip_group(head, at + 1);
    let inner = &head[at + 2..close.saturating_sub(1).max(at + 2)];
    let mut params = Vec::new();
    let pieces = split_commas(inner);
    let only_void = pieces.len() == 1 && pieces[0].len() == 1 && pieces[0][0].is_ident("void");
    if !only_void && !inner.is_empty() {
        for (index, piece) in pieces.iter().enumerate() {
            params.push(param(piece, index, &name, head[at].line)?);
        }
    }
    Ok(KernelSig {
        name,
        line: head[at].line,
        params,
        comment: None,
        comment_end: 0,
    })
}

/// Splits a parameter list at its top-level commas.
fn split_commas(tokens: &[Token]) -> Vec<&[Token]> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, t) in tokens.iter().enumerate() {
        if t.is_punct("(") || t.is_punct("[") || t.is_punct("<") || t.is_punct("{") {
            depth += 1;
        } else if t.is_punct(")") || t.is_punct("]") || t.is_punct(">") || t.is_punct("}") {
            depth = depth.saturating_sub(1);
        } else if depth == 0 && t.is_punct(",") {
            out.push(&tokens[start..i]);
            start = i + 1;
        }
    }
    out.push(&tokens[start..]);
    out
}

fn texts(tokens: &[Token]) -> String {
    let joined: Vec<String> = tokens.iter().map(Token::text).collect();
    joined
        .join(" ")
        .replace(" *", "*")
        .replace(" :: ", "::")
        .replace(" ,", ",")
        .replace("( ", "(")
        .replace(" )", ")")
}

fn param(
    tokens: &[Token],
    index: usize,
    kernel: &str,
    kernel_line: u32,
) -> Result<ParamSig, ParseError> {
    let line = tokens.first().map_or(kernel_line, |t| t.line);
    let text = texts(tokens);
    let fail = |why: &str| ParseError {
        line,
        message: format!("kernel `{kernel}`, parameter {index} (`{text}`): {why}"),
    };
    if tokens.is_empty() {
        return Err(fail("empty parameter"));
    }
    let mut words: Vec<String> = Vec::new();
    let mut c_type: Vec<Token> = Vec::new();
    let mut stars = 0;
    let mut pointee_const = false;
    let mut i = 0;
    while i < tokens.len() {
        let t = &tokens[i];
        match &t.tok {
            Tok::Ident(w) if ATTRIBUTES_WITH_ARGS.contains(&w.as_str()) => {
                i = if tokens.get(i + 1).is_some_and(|n| n.is_punct("(")) {
                    skip_group(tokens, i + 1)
                } else {
                    i + 1
                };
                continue;
            }
            Tok::Ident(w) if QUALIFIERS.contains(&w.as_str()) => {
                if w == "const" && stars == 0 {
                    pointee_const = true;
                }
                if !w.starts_with("__restrict") && w != "restrict" && w != "__grid_constant__" {
                    c_type.push(t.clone());
                }
            }
            Tok::Ident(w) => {
                if tokens.get(i + 1).is_some_and(|n| n.is_punct("::")) {
                    // A qualified name: `std::size_t`.
                    let mut path = w.clone();
                    while tokens.get(i + 1).is_some_and(|n| n.is_punct("::")) {
                        match tokens.get(i + 2).and_then(Token::ident) {
                            Some(next) => {
                                path.push_str("::");
                                path.push_str(next);
                                i += 2;
                            }
                            None => return Err(fail("a `::` path that does not end in a name")),
                        }
                    }
                    words.push(path.clone());
                    c_type.push(Token {
                        tok: Tok::Ident(path),
                        line: t.line,
                        comment: None,
                    });
                } else {
                    words.push(w.clone());
                    c_type.push(t.clone());
                }
            }
            Tok::Punct("*") => {
                stars += 1;
                c_type.push(t.clone());
            }
            Tok::Punct("&") => {
                return Err(fail("a reference: kernels take values and device pointers"));
            }
            Tok::Punct("[") => {
                return Err(fail(
                    "an array parameter: write it as a pointer (`float* x`), or wrap a fixed-size array in a struct passed by value",
                ));
            }
            Tok::Punct("<") => {
                return Err(fail(
                    "a template type: stepgraph-build reads plain types; typedef it, or map the spelling with `Builder::rust_type`",
                ));
            }
            Tok::Punct("=") => return Err(fail("a default argument: kernels cannot have them")),
            Tok::Punct(".") => return Err(fail("a variadic parameter: kernels cannot have them")),
            _ => return Err(fail(&format!("unexpected `{}`", t.text()))),
        }
        i += 1;
    }
    // The name is the last word when something else names the type: `unsigned n`,
    // `BranchIn adv`, `float* x`. `unsigned int`, `BranchIn` and `float*` are unnamed.
    let name = match words.last() {
        Some(last) if words.len() >= 2 && !is_builtin(last) => {
            let name = words.pop();
            if let Some(pos) = c_type.iter().rposition(|t| t.ident() == name.as_deref()) {
                c_type.remove(pos);
            }
            name
        }
        _ => None,
    };
    if words.is_empty() {
        return Err(fail("no type"));
    }
    Ok(ParamSig {
        name,
        line,
        words,
        stars,
        pointee_const,
        c_type: texts(&c_type),
        text,
    })
}

pub(crate) fn is_builtin(word: &str) -> bool {
    BUILTIN_WORDS.contains(&word)
}

/// The typedefs and structs declared anywhere in `tokens`.
pub(crate) fn declared(tokens: &[Token]) -> Declared {
    let mut d = Declared::default();
    let mut i = 0;
    while i < tokens.len() {
        let t = &tokens[i];
        if t.is_ident("typedef") {
            let stop = (i + 1..tokens.len())
                .find(|&j| tokens[j].is_punct(";") || tokens[j].is_punct("{"))
                .unwrap_or(tokens.len());
            if tokens.get(stop).is_some_and(|t| t.is_punct("{")) {
                // `typedef struct { .. } Name;`
                let close = skip_group(tokens, stop);
                if tokens.get(i + 1).is_some_and(|t| t.is_ident("struct"))
                    && let Some(name) = tokens.get(close).and_then(Token::ident)
                {
                    d.structs.insert(name.to_string(), t.line);
                    if let Some(table) = ptr_table(&tokens[stop + 1..close - 1]) {
                        d.tables.insert(name.to_string(), table);
                    }
                }
                i = close;
                continue;
            }
            if let Some((name, def)) = alias(&tokens[i + 1..stop], t.line) {
                d.typedefs.insert(name, def);
            }
            i = stop;
        } else if t.is_ident("using")
            && let (Some(name), Some(eq)) = (tokens.get(i + 1), tokens.get(i + 2))
            && let Some(name) = name.ident()
            && eq.is_punct("=")
        {
            let end = (i..tokens.len())
                .find(|&j| tokens[j].is_punct(";"))
                .unwrap_or(tokens.len());
            let mut body: Vec<Token> = tokens[i + 3..end].to_vec();
            body.push(Token {
                tok: Tok::Ident(name.to_string()),
                line: t.line,
                comment: None,
            });
            if let Some((name, def)) = alias(&body, t.line) {
                d.typedefs.insert(name, def);
            }
            i = end;
        } else if (t.is_ident("struct") || t.is_ident("class"))
            && let Some(name) = tokens.get(i + 1).and_then(Token::ident)
            && tokens
                .get(i + 2)
                .is_some_and(|t| t.is_punct("{") || t.is_punct(":"))
        {
            d.structs.insert(name.to_string(), t.line);
            if tokens[i + 2].is_punct("{") {
                let close = skip_group(tokens, i + 2);
                if let Some(table) = ptr_table(&tokens[i + 3..close.saturating_sub(1)]) {
                    d.tables.insert(name.to_string(), table);
                }
            }
            i += 2;
        } else {
            i += 1;
        }
    }
    d
}

/// A struct body of exactly one member, `[const] T* name[N];`.
fn ptr_table(body: &[Token]) -> Option<PtrTableDecl> {
    let [front @ .., field, open, slots, close, semi] = body else {
        return None;
    };
    let slots = match &slots.tok {
        Tok::Number(n) if n.bytes().all(|b| b.is_ascii_digit()) => n.clone(),
        Tok::Ident(n) => n.clone(),
        _ => return None,
    };
    if !(field.ident().is_some() && open.is_punct("[") && close.is_punct("]") && semi.is_punct(";"))
    {
        return None;
    }
    // `T* __restrict__ name`: one star, then only qualifiers.
    let star = front.iter().position(|t| t.is_punct("*"))?;
    let after_star_ok = front[star + 1..].iter().all(|t| {
        t.ident()
            .is_some_and(|w| QUALIFIERS.contains(&w) && w != "const")
    });
    if !after_star_ok {
        return None;
    }
    let mut words = Vec::new();
    let mut pointee_const = false;
    for t in &front[..star] {
        match t.ident()? {
            "const" => pointee_const = true,
            w if QUALIFIERS.contains(&w) => {}
            w => words.push(w.to_string()),
        }
    }
    (!words.is_empty()).then_some(PtrTableDecl {
        words,
        pointee_const,
        slots,
    })
}

/// `unsigned long long u64` (the part of a typedef between `typedef` and `;`).
fn alias(body: &[Token], line: u32) -> Option<(String, Typedef)> {
    let name = body.last()?.ident()?.to_string();
    let mut words = Vec::new();
    let mut stars = 0;
    for t in &body[..body.len() - 1] {
        match &t.tok {
            Tok::Ident(w) if QUALIFIERS.contains(&w.as_str()) => {}
            Tok::Ident(w) => words.push(w.clone()),
            Tok::Punct("*") => stars += 1,
            Tok::Punct("::") => {
                let last = words.pop()?;
                words.push(format!("{last}::"));
            }
            // Function pointers, arrays: not a type a kernel parameter can use here.
            _ => return None,
        }
    }
    // Rejoin `std::` `size_t` into `std::size_t`.
    let mut joined: Vec<String> = Vec::new();
    for w in words {
        match joined.last_mut() {
            Some(prev) if prev.ends_with("::") => prev.push_str(&w),
            _ => joined.push(w),
        }
    }
    if joined.is_empty() {
        return None;
    }
    Some((
        name,
        Typedef {
            words: joined,
            stars,
            line,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lex::lex;

    fn one(src: &str) -> KernelSig {
        let (k, e) = kernels(&lex(src).tokens);
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(k.len(), 1, "{k:?}");
        k.into_iter().next().unwrap()
    }

    fn summary(k: &KernelSig) -> Vec<(Option<&str>, String, usize, bool, &str)> {
        k.params
            .iter()
            .map(|p| {
                (
                    p.name.as_deref(),
                    p.words.join(" "),
                    p.stars,
                    p.pointee_const,
                    p.c_type.as_str(),
                )
            })
            .collect()
    }

    #[test]
    fn a_plain_kernel() {
        let k = one(
            "extern \"C\" __global__ void axpby(const float* __restrict__ x, float* __restrict__ y, unsigned n,\n float a, float b) { y[0] = x[0]; }",
        );
        assert_eq!(k.name, "axpby");
        assert_eq!(k.line, 1);
        assert_eq!(
            summary(&k),
            [
                (Some("x"), "float".into(), 1, true, "const float*"),
                (Some("y"), "float".into(), 1, false, "float*"),
                (Some("n"), "unsigned".into(), 0, false, "unsigned"),
                (Some("a"), "float".into(), 0, false, "float"),
                (Some("b"), "float".into(), 0, false, "float"),
            ]
        );
        assert_eq!(k.params[4].line, 2);
        assert_eq!(
            k.signature(),
            "__global__ void axpby(const float* __restrict__ x, float* __restrict__ y, unsigned n, float a, float b)"
        );
    }

    #[test]
    fn every_scalar_spelling() {
        let k = one(
            "extern \"C\" __global__ void k(unsigned int a, int b, double c, unsigned long long d,
                long long e, size_t f, std::size_t g, int64_t h, uint64_t i, uint32_t j, int32_t k,
                uint8_t l, unsigned char m, __nv_bfloat16 n, __half o, const int p, signed char q,
                unsigned short r, long s, bool t) {}",
        );
        let words: Vec<String> = k.params.iter().map(|p| p.words.join(" ")).collect();
        assert_eq!(
            words,
            [
                "unsigned int",
                "int",
                "double",
                "unsigned long long",
                "long long",
                "size_t",
                "std::size_t",
                "int64_t",
                "uint64_t",
                "uint32_t",
                "int32_t",
                "uint8_t",
                "unsigned char",
                "__nv_bfloat16",
                "__half",
                "int",
                "signed char",
                "unsigned short",
                "long",
                "bool"
            ]
        );
        let names: String = k.params.iter().map(|p| p.name.clone().unwrap()).collect();
        assert_eq!(names, "abcdefghijklmnopqrst");
        assert_eq!(k.params[15].c_type, "const int");
    }

    #[test]
    fn attributes_before_the_name_are_skipped() {
        for src in [
            "extern \"C\" __global__ void __launch_bounds__(256, 2)\n    k(float* x) {}",
            "extern \"C\" __global__ void __maxnreg__(88) k(float* x) {}",
            "extern \"C\" __global__ void __launch_bounds__(32 * MAX_WARPS, 1) __cluster_dims__(2, 1, 1) k(float* x) {}",
            "extern \"C\" __global__ __attribute__((noinline)) void k(float* x) {}",
        ] {
            let k = one(src);
            assert_eq!(k.name, "k", "{src}");
            assert_eq!(k.params.len(), 1, "{src}");
        }
    }

    #[test]
    fn comments_are_stripped_and_the_one_above_is_kept() {
        let k = one(
            "// y <- 2 y\n// (in place)\nextern \"C\" __global__ void /* why */ twice(float* /* the data */ y, // out\n unsigned n /* count */) {}",
        );
        assert_eq!(k.comment.as_deref(), Some("y <- 2 y\n(in place)"));
        assert_eq!(k.params.len(), 2);
        assert_eq!(k.params[1].line, 4);
        assert_eq!(k.params[1].name.as_deref(), Some("n"));
    }

    #[test]
    fn an_extern_c_block_holds_several_kernels_and_other_declarations() {
        let (k, e) = kernels(
            &lex("extern \"C\" {\n struct S { int a; };\n __device__ int f(int x) { return x; }\n __global__ void a(int* x) {}\n __global__ void b(void) {}\n __global__ void c() {}\n}\n__global__ void not_c(float* x) {}\n")
                .tokens,
        );
        assert!(e.is_empty());
        let names: Vec<&str> = k.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert!(k[1].params.is_empty() && k[2].params.is_empty());
    }

    #[test]
    fn kernels_without_c_linkage_and_declarations_are_ignored() {
        let (k, e) = kernels(
            &lex("__global__ void mangled(float* x) {}\ntemplate <int N> __global__ void t(float* x) {}\nextern \"C\" __global__ void declared(float* x);\nextern \"C\" __device__ float helper(float x) { return x; }\n")
                .tokens,
        );
        assert!(k.is_empty() && e.is_empty(), "{k:?} {e:?}");
    }

    #[test]
    fn struct_parameters_by_value_and_unnamed_parameters() {
        let k = one(
            "extern \"C\" __global__ void k(const float* __restrict__ v, const BranchIn adv, BranchOut, struct Pair p, const __grid_constant__ Params q, unsigned, float*) {}",
        );
        assert_eq!(
            summary(&k),
            [
                (Some("v"), "float".into(), 1, true, "const float*"),
                (Some("adv"), "BranchIn".into(), 0, true, "const BranchIn"),
                (None, "BranchOut".into(), 0, false, "BranchOut"),
                (Some("p"), "Pair".into(), 0, false, "struct Pair"),
                (Some("q"), "Params".into(), 0, true, "const Params"),
                (None, "unsigned".into(), 0, false, "unsigned"),
                (None, "float".into(), 1, false, "float*"),
            ]
        );
    }

    #[test]
    fn pointer_constness_is_read_from_where_const_stands() {
        let k = one(
            "extern \"C\" __global__ void k(float const* a, float* const b, const float* const c, const u64* t) {}",
        );
        let c: Vec<bool> = k.params.iter().map(|p| p.pointee_const).collect();
        assert_eq!(c, [true, false, true, true]);
        assert_eq!(k.params[1].c_type, "float* const");
    }

    #[test]
    fn unreadable_signatures_are_errors_at_their_line() {
        for (src, want) in [
            (
                "extern \"C\" __global__ void k(\n float& x) {}",
                "reference",
            ),
            (
                "extern \"C\" __global__ void k(\n float x[4]) {}",
                "array parameter",
            ),
            (
                "extern \"C\" __global__ void k(\n Vec<float> x) {}",
                "template type",
            ),
            (
                "extern \"C\" __global__ void k(\n int x = 3) {}",
                "default argument",
            ),
            (
                "extern \"C\" __global__ void k(\n int x, ...) {}",
                "variadic",
            ),
        ] {
            let (k, e) = kernels(&lex(src).tokens);
            assert!(k.is_empty(), "{src}");
            assert_eq!(e.len(), 1, "{src}");
            assert_eq!(e[0].line, 2, "{src}");
            assert!(e[0].message.contains(want), "{src}: {}", e[0].message);
            assert!(
                e[0].message.starts_with("kernel `k`, parameter"),
                "{}",
                e[0].message
            );
        }
        let (_, e) = kernels(&lex("extern \"C\" __global__ void {}").tokens);
        assert!(e[0].message.contains("no `name(parameters)`"), "{e:?}");
    }

    #[test]
    fn typedefs_and_structs_are_collected() {
        let d = declared(
            &lex("typedef unsigned long long u64;\nusing idx = std::size_t;\ntypedef float* fptr;\nstruct BranchIn {\n const float* p[8];\n};\ntypedef struct { int a; } Pair;\ntypedef void (*fn)(int);\n")
                .tokens,
        );
        assert_eq!(d.typedefs["u64"].words, ["unsigned", "long", "long"]);
        assert_eq!(d.typedefs["idx"].words, ["std::size_t"]);
        assert_eq!(d.typedefs["fptr"].stars, 1);
        assert!(!d.typedefs.contains_key("fn"));
        assert_eq!(d.structs["BranchIn"], 4);
        assert_eq!(d.structs["Pair"], 7);
        assert_eq!(
            d.tables["BranchIn"],
            PtrTableDecl {
                words: vec!["float".into()],
                pointee_const: true,
                slots: "8".into()
            }
        );
        assert!(!d.tables.contains_key("Pair"));
    }

    #[test]
    fn only_a_struct_of_one_pointer_array_is_a_pointer_table() {
        let d = declared(
            &lex("typedef struct { float* __restrict__ q[MAX_B]; } Out;\nstruct Two { float* a[4]; int n; };\nstruct Arr { float a[4]; };\nstruct Pp { float** a[4]; };\n")
                .tokens,
        );
        assert_eq!(
            d.tables["Out"],
            PtrTableDecl {
                words: vec!["float".into()],
                pointee_const: false,
                slots: "MAX_B".into()
            }
        );
        for name in ["Two", "Arr", "Pp"] {
            assert!(d.structs.contains_key(name), "{name}");
            assert!(!d.tables.contains_key(name), "{name}");
        }
    }
}
