//! A kernel's size contract: the `// stepgraph(unsafe): ...` lines of the comment above
//! its signature, read into the lengths its buffers must have, the sizes that must be
//! positive and the grid it is launched with. From it the builder generates a safe
//! `<kernel>_checked` method next to the unsafe launcher.
//!
//! ```text
//! // stepgraph(unsafe): u[2 * n], g[n], width > 0, grid = elementwise(n)
//! extern "C" __global__ void glu_forward(const float* u, float* g, unsigned n, unsigned width)
//! ```
//!
//! Items, separated by commas (several `stepgraph(unsafe):` lines add up):
//!
//! - `x[size]`: buffer `x` holds exactly `size` elements; `x[>= size]` at least that many.
//! - `t[count][size]`: `t` is a struct that holds one array of device pointers
//!   (`struct BranchIn { const float* p[8]; }`, one buffer per branch); the safe method
//!   takes a slice of exactly `count` buffers (at most the array's length), each of
//!   exactly `size` elements (`t[count][>= size]`: at least).
//! - `n > 0`: the integer parameter `n` is at least 1.
//! - `a <= b`, `a >= b`, `a == b`: a condition on sizes, such as the most units a kernel's
//!   register arrays hold (`H <= 32 * MAX_UNITS`) or a vector width (`S % 4 == 0`).
//! - `grid = elementwise(count)`: one thread per item, blocks of 256, at least one block;
//!   `grid = tiles(x, y)`: `(x, y)` blocks of 32 × 32 threads (at least one each way);
//!   `grid = blocks(count, threads)`: `count` blocks of `threads`;
//!   `grid = launch((x, y, z), (tx, ty, tz))`: any grid and block, each a size or a tuple
//!   of one to three (missing ones are 1; a grid's counts are at least 1). Without a grid
//!   the safe method takes the launch config as its caller's argument.
//!
//! A size is an integer expression over the kernel's integer parameters, decimal literals
//! and integer `#define`s of the source and the headers it includes (`LOSS_SLOTS`), with
//! `+`, `-`, `*`, `%`, parentheses, `cdiv(a, b)` (division rounded up), `min(a, b)` and
//! `max(a, b)`.

use std::collections::BTreeMap;

use crate::types::Pass;

/// The marker that starts a contract line. `unsafe` because the line is a promise the
/// builder cannot check: that the kernel stays inside these lengths on this grid.
pub(crate) const MARKER: &str = "stepgraph(unsafe):";

/// A size expression.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Expr {
    Lit(u64),
    /// An integer parameter, by its C name.
    Param(String),
    /// An integer `#define` of the source or its headers: its name and value.
    Const(String, u64),
    Add(Box<Expr>, Box<Expr>),
    Sub(Box<Expr>, Box<Expr>),
    Mul(Box<Expr>, Box<Expr>),
    /// The remainder, `a % b`.
    Rem(Box<Expr>, Box<Expr>),
    CeilDiv(Box<Expr>, Box<Expr>),
    Min(Box<Expr>, Box<Expr>),
    Max(Box<Expr>, Box<Expr>),
}

impl Expr {
    /// As written, normalised: `2 * n`, `cdiv(n, 4)`.
    pub fn text(&self) -> String {
        self.text_in(0)
    }

    fn text_in(&self, outer: u8) -> String {
        let (own, s) = match self {
            Expr::Lit(v) => return v.to_string(),
            Expr::Param(p) | Expr::Const(p, _) => return p.clone(),
            Expr::CeilDiv(a, b) => return format!("cdiv({}, {})", a.text(), b.text()),
            Expr::Min(a, b) => return format!("min({}, {})", a.text(), b.text()),
            Expr::Max(a, b) => return format!("max({}, {})", a.text(), b.text()),
            Expr::Add(a, b) => (1, format!("{} + {}", a.text_in(1), b.text_in(2))),
            Expr::Sub(a, b) => (1, format!("{} - {}", a.text_in(1), b.text_in(2))),
            Expr::Mul(a, b) => (3, format!("{} * {}", a.text_in(3), b.text_in(4))),
            Expr::Rem(a, b) => (3, format!("{} % {}", a.text_in(3), b.text_in(4))),
        };
        if own < outer { format!("({s})") } else { s }
    }

    /// The parameters it names, in order of appearance.
    pub fn params(&self, out: &mut Vec<String>) {
        if let Expr::Param(p) = self
            && !out.contains(p)
        {
            out.push(p.clone());
        }
        if let Some((a, b)) = self.operands() {
            a.params(out);
            b.params(out);
        }
    }

    /// The two operands of an operator or a function; `None` for a leaf.
    fn operands(&self) -> Option<(&Expr, &Expr)> {
        match self {
            Expr::Add(a, b)
            | Expr::Sub(a, b)
            | Expr::Mul(a, b)
            | Expr::Rem(a, b)
            | Expr::CeilDiv(a, b)
            | Expr::Min(a, b)
            | Expr::Max(a, b) => Some((a, b)),
            Expr::Lit(_) | Expr::Param(_) | Expr::Const(..) => None,
        }
    }

    fn operands_mut(&mut self) -> Option<(&mut Expr, &mut Expr)> {
        match self {
            Expr::Add(a, b)
            | Expr::Sub(a, b)
            | Expr::Mul(a, b)
            | Expr::Rem(a, b)
            | Expr::CeilDiv(a, b)
            | Expr::Min(a, b)
            | Expr::Max(a, b) => Some((a, b)),
            Expr::Lit(_) | Expr::Param(_) | Expr::Const(..) => None,
        }
    }
}

/// How many elements a buffer must hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Len {
    Exactly(Expr),
    AtLeast(Expr),
}

/// The launch grid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Grid {
    Elementwise(Expr),
    Tiles(Expr, Expr),
    Blocks(Expr, Expr),
    /// `launch(grid, block)`: one to three counts each.
    Launch(Vec<Expr>, Vec<Expr>),
}

impl Grid {
    /// Every size it names.
    pub fn exprs(&self) -> Vec<&Expr> {
        match self {
            Grid::Elementwise(a) => vec![a],
            Grid::Tiles(a, b) | Grid::Blocks(a, b) => vec![a, b],
            Grid::Launch(g, b) => g.iter().chain(b).collect(),
        }
    }

    fn exprs_mut(&mut self) -> Vec<&mut Expr> {
        match self {
            Grid::Elementwise(a) => vec![a],
            Grid::Tiles(a, b) | Grid::Blocks(a, b) => vec![a, b],
            Grid::Launch(g, b) => g.iter_mut().chain(b.iter_mut()).collect(),
        }
    }
}

/// How a condition compares its two sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cmp {
    Le,
    Ge,
    Eq,
}

impl Cmp {
    pub fn text(self) -> &'static str {
        match self {
            Cmp::Le => "<=",
            Cmp::Ge => ">=",
            Cmp::Eq => "==",
        }
    }
}

/// `lhs <= rhs` and the like: a condition on sizes that the kernel relies on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Cond {
    pub lhs: Expr,
    pub cmp: Cmp,
    pub rhs: Expr,
}

impl Cond {
    pub fn text(&self) -> String {
        format!(
            "{} {} {}",
            self.lhs.text(),
            self.cmp.text(),
            self.rhs.text()
        )
    }
}

/// A kernel's contract, as declared.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Contract {
    /// Its lines, as written after the marker, for the safe method's docs.
    pub text: Vec<String>,
    /// Buffer (by C name) and length, in the order declared.
    pub lens: Vec<(String, Len)>,
    /// Pointer table (by C name), its count of buffers and each one's length.
    pub tables: Vec<(String, Expr, Len)>,
    /// Integer parameters that must be at least 1.
    pub positive: Vec<String>,
    /// Conditions on sizes, in the order declared.
    pub conditions: Vec<Cond>,
    pub grid: Option<Grid>,
}

/// A parameter as the contract sees it.
#[derive(Clone, Debug)]
pub(crate) struct ParamView<'a> {
    pub c_name: &'a str,
    pub rust: &'a str,
    pub pass: Pass,
    pub mapped_value: bool,
}

/// Rust integer types a size parameter may have: the safe method takes it as a `usize`
/// and converts it, refusing a value the type cannot hold.
pub(crate) const SIZE_TYPES: &[&str] = &[
    "u8", "u16", "u32", "u64", "usize", "i8", "i16", "i32", "i64", "isize",
];

/// A problem in a contract, at a line of its file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ContractError {
    pub line: u32,
    pub message: String,
}

/// Reads the contract of `kernel` from `comment`, whose last line is `end_line`; `None`
/// when the comment has no contract line.
pub(crate) fn read(
    kernel: &str,
    comment: Option<&str>,
    end_line: u32,
    params: &[ParamView<'_>],
    constants: &BTreeMap<String, u64>,
) -> Result<Option<Contract>, Vec<ContractError>> {
    let Some(comment) = comment else {
        return Ok(None);
    };
    let lines: Vec<&str> = comment.lines().collect();
    let first = end_line + 1 - (lines.len() as u32).min(end_line);
    let mut contract = Contract::default();
    let mut errors = Vec::new();
    let mut seen = false;
    for (i, raw) in lines.iter().enumerate() {
        let line = first + i as u32;
        let text = raw.trim();
        let fail = |message: String| ContractError {
            line,
            message: format!("kernel `{kernel}`: {message}"),
        };
        let Some(body) = text.strip_prefix(MARKER) else {
            if let Some(rest) = text.strip_prefix("stepgraph")
                && rest.trim_start().starts_with([':', '('])
            {
                errors.push(fail(format!(
                    "expected a contract line starting `{MARKER}`, found `{text}` (the \
                     `unsafe` says that the kernel keeps inside these lengths, which the \
                     builder cannot check)"
                )));
            }
            continue;
        };
        seen = true;
        contract.text.push(body.trim().to_string());
        match items(body) {
            Ok(items) => {
                for item in items {
                    if let Err(why) = add_item(&mut contract, item, params, constants) {
                        errors.push(fail(why));
                    }
                }
            }
            Err(why) => errors.push(fail(why)),
        }
    }
    if !errors.is_empty() {
        // The coverage checks below would only repeat what a bad item left out.
        return Err(errors);
    }
    if !seen {
        return Ok(None);
    }
    let fail = |message: String| ContractError {
        line: end_line,
        message: format!("kernel `{kernel}`: {message}"),
    };
    let errors: Vec<ContractError> = params
        .iter()
        .filter_map(|p| {
            check_buffer_has_length(p, &contract)
                .and(check_no_struct_by_value(p))
                .err()
        })
        .map(fail)
        .collect();
    if errors.is_empty() {
        Ok(Some(contract))
    } else {
        Err(errors)
    }
}

/// A buffer without a declared length could be indexed anywhere.
fn check_buffer_has_length(p: &ParamView<'_>, contract: &Contract) -> Result<(), String> {
    let name = display(p.c_name);
    if let Pass::Table { .. } = p.pass {
        if contract.tables.iter().any(|(n, ..)| n == p.c_name) {
            return Ok(());
        }
        return Err(format!(
            "the contract gives no count and length for pointer table `{name}`: add \
             `{name}[<count>][<size>]`"
        ));
    }
    if p.pass == Pass::Value || contract.lens.iter().any(|(name, _)| name == p.c_name) {
        return Ok(());
    }
    Err(format!(
        "the contract gives no length for buffer `{name}`: add `{name}[<size>]` (or \
         `{name}[>= <size>]`)"
    ))
}

/// A struct by value may hold device addresses, whose buffers no length here describes.
fn check_no_struct_by_value(p: &ParamView<'_>) -> Result<(), String> {
    if !p.mapped_value {
        return Ok(());
    }
    Err(format!(
        "parameter `{}` is a `{}` by value, whose contents a contract cannot check: launch \
         this kernel with its unsafe launcher",
        display(p.c_name),
        p.rust
    ))
}

fn display(name: &str) -> &str {
    if name.is_empty() { "(unnamed)" } else { name }
}

/// One item as read, before it is checked against the parameters.
#[derive(Debug)]
enum Item {
    Len(String, Len),
    Table(String, Expr, Len),
    Positive(String),
    Cond(Cond),
    Grid(Grid),
}

fn add_item(
    c: &mut Contract,
    item: Item,
    params: &[ParamView<'_>],
    constants: &BTreeMap<String, u64>,
) -> Result<(), String> {
    let names = |e: &mut Expr| {
        resolve(e, params, constants);
        check_sizes(e, params)
    };
    match item {
        Item::Len(name, mut len) => {
            let p = find(params, &name)?;
            if p.pass == Pass::Value {
                return Err(format!(
                    "`{name}[..]` gives a length, but `{name}` is a value, not a buffer"
                ));
            }
            if let Pass::Table { slots, .. } = p.pass {
                return Err(format!(
                    "`{name}` is a table of up to {slots} buffers: give their count and each \
                     one's length, `{name}[<count>][<size>]`"
                ));
            }
            if c.lens.iter().any(|(n, _)| *n == name) {
                return Err(format!("buffer `{name}` has two lengths"));
            }
            let (Len::Exactly(e) | Len::AtLeast(e)) = &mut len;
            names(e)?;
            c.lens.push((name, len));
        }
        Item::Table(name, mut count, mut len) => {
            let p = find(params, &name)?;
            if !matches!(p.pass, Pass::Table { .. }) {
                return Err(format!(
                    "`{name}[..][..]` describes a table of buffers, but `{name}` is {}: a \
                     struct that holds one array of pointers is one",
                    if p.pass == Pass::Value {
                        "a value"
                    } else {
                        "one buffer"
                    }
                ));
            }
            if c.tables.iter().any(|(n, ..)| *n == name) {
                return Err(format!("table `{name}` has two lengths"));
            }
            names(&mut count)?;
            let (Len::Exactly(e) | Len::AtLeast(e)) = &mut len;
            names(e)?;
            c.tables.push((name, count, len));
        }
        Item::Positive(name) => {
            size_param(params, &name)?;
            if !c.positive.contains(&name) {
                c.positive.push(name);
            }
        }
        Item::Cond(mut cond) => {
            names(&mut cond.lhs)?;
            names(&mut cond.rhs)?;
            c.conditions.push(cond);
        }
        Item::Grid(mut grid) => {
            if c.grid.is_some() {
                return Err("two grids: declare one `grid = ...`".into());
            }
            grid.exprs_mut().into_iter().try_for_each(names)?;
            c.grid = Some(grid);
        }
    }
    Ok(())
}

fn find<'p, 'a>(params: &'p [ParamView<'a>], name: &str) -> Result<&'p ParamView<'a>, String> {
    params.iter().find(|p| p.c_name == name).ok_or_else(|| {
        let names: Vec<&str> = params
            .iter()
            .map(|p| p.c_name)
            .filter(|n| !n.is_empty())
            .collect();
        format!(
            "expected a parameter of the kernel ({}), found `{name}`",
            names.join(", ")
        )
    })
}

fn size_param(params: &[ParamView<'_>], name: &str) -> Result<(), String> {
    let p = find(params, name)?;
    if p.pass != Pass::Value || !SIZE_TYPES.contains(&p.rust) {
        let found = match p.pass {
            Pass::Value => format!("a `{}`", p.rust),
            _ => "a buffer".to_string(),
        };
        return Err(format!(
            "expected an integer parameter as a size, found `{name}`, {found}"
        ));
    }
    Ok(())
}

/// A name that is no parameter but an integer `#define` becomes that constant.
fn resolve(e: &mut Expr, params: &[ParamView<'_>], constants: &BTreeMap<String, u64>) {
    if let Expr::Param(n) = e
        && !params.iter().any(|p| p.c_name == *n)
        && let Some(&v) = constants.get(n.as_str())
    {
        *e = Expr::Const(n.clone(), v);
    }
    if let Some((a, b)) = e.operands_mut() {
        resolve(a, params, constants);
        resolve(b, params, constants);
    }
}

fn check_sizes(e: &Expr, params: &[ParamView<'_>]) -> Result<(), String> {
    let mut names = Vec::new();
    e.params(&mut names);
    names.iter().try_for_each(|n| {
        if params.iter().any(|p| p.c_name == n) {
            size_param(params, n)
        } else {
            find(params, n).map_err(|why| {
                why.replace(
                    "expected a parameter of the kernel",
                    "expected an integer `#define` or a parameter of the kernel",
                )
            })?;
            Ok(())
        }
    })
}

/// The items of one line, split at its top-level commas.
fn items(body: &str) -> Result<Vec<Item>, String> {
    let mut toks = tokens(body)?;
    // A trailing comma continues the contract on the next line.
    if toks.len() > 1 && toks.last() == Some(&Tk::Comma) {
        toks.pop();
    }
    let mut out = Vec::new();
    for piece in split(&toks, &Tk::Comma) {
        if piece.is_empty() {
            return Err(format!(
                "expected an item, found an empty one in `{}`",
                body.trim()
            ));
        }
        out.push(item(piece)?);
    }
    Ok(out)
}

fn item(t: &[Tk]) -> Result<Item, String> {
    let text = show(t);
    match t {
        [Tk::Ident(g), Tk::Punct('='), rest @ ..] if g == "grid" => grid(rest).map(Item::Grid),
        [Tk::Ident(n), Tk::Punct('>'), Tk::Num(0)] => Ok(Item::Positive(n.clone())),
        [Tk::Ident(n), Tk::Punct('['), inner @ .., Tk::Punct(']')] => {
            // `t[count][size]`: the first bracket closes before the last token.
            let close = bracket_close(inner);
            match close.map(|at| (&inner[..at], &inner[at + 1..])) {
                Some((count, [Tk::Punct('['), len @ ..])) => {
                    Ok(Item::Table(n.clone(), expr_all(count)?, length(len)?))
                }
                Some(_) => Err(format!(
                    "expected `buffer[size]` or `table[count][size]`, found `{text}`"
                )),
                None => Ok(Item::Len(n.clone(), length(inner)?)),
            }
        }
        _ => match comparison(t) {
            Some((at, cmp)) => Ok(Item::Cond(Cond {
                lhs: expr_all(&t[..at])?,
                cmp,
                rhs: expr_all(&t[at + 2..])?,
            })),
            None => Err(format!(
                "expected `buffer[size]`, `buffer[>= size]`, `table[count][size]`, `size > 0`, \
                 a condition such as `a <= b` or `grid = ...`, found `{text}`"
            )),
        },
    }
}

/// `size` or `>= size`, inside a buffer's brackets.
fn length(t: &[Tk]) -> Result<Len, String> {
    Ok(match t {
        [Tk::Punct('>'), Tk::Punct('='), e @ ..] => Len::AtLeast(expr_all(e)?),
        e => Len::Exactly(expr_all(e)?),
    })
}

/// Where a `]` closes the bracket already open at the start of `t`, if it does before
/// `t` ends.
fn bracket_close(t: &[Tk]) -> Option<usize> {
    let mut depth = 0usize;
    for (i, tk) in t.iter().enumerate() {
        match tk {
            Tk::Punct('(' | '[') => depth += 1,
            Tk::Punct(')') => depth = depth.saturating_sub(1),
            Tk::Punct(']') if depth == 0 => return Some(i),
            Tk::Punct(']') => depth -= 1,
            _ => {}
        }
    }
    None
}

/// Where `t` compares two sizes (`<=`, `>=`, `==` outside brackets), and how.
fn comparison(t: &[Tk]) -> Option<(usize, Cmp)> {
    let mut depth = 0usize;
    for (i, pair) in t.windows(2).enumerate() {
        match &pair[0] {
            Tk::Punct('(' | '[') => depth += 1,
            Tk::Punct(')' | ']') => depth = depth.saturating_sub(1),
            Tk::Punct(c @ ('<' | '>' | '=')) if depth == 0 && pair[1] == Tk::Punct('=') => {
                let cmp = match c {
                    '<' => Cmp::Le,
                    '>' => Cmp::Ge,
                    _ => Cmp::Eq,
                };
                return Some((i, cmp));
            }
            _ => {}
        }
    }
    None
}

fn grid(t: &[Tk]) -> Result<Grid, String> {
    let text = show(t);
    let expected = "expected `elementwise(count)`, `tiles(x, y)`, `blocks(count, threads)` or \
                    `launch(grid, block)`";
    let [Tk::Ident(rule), Tk::Punct('('), inner @ .., Tk::Punct(')')] = t else {
        return Err(format!("grid: {expected}, found `{text}`"));
    };
    if rule == "launch" {
        let parts = split(inner, &Tk::Comma);
        let [grid, block] = parts.as_slice() else {
            return Err(format!(
                "grid: expected `launch(grid, block)`, two sizes or tuples, found `{text}`"
            ));
        };
        return Ok(Grid::Launch(dims(grid)?, dims(block)?));
    }
    let args = split(inner, &Tk::Comma)
        .into_iter()
        .map(expr_all)
        .collect::<Result<Vec<_>, _>>()?;
    let mut args = args.into_iter();
    match (rule.as_str(), args.len()) {
        ("elementwise", 1) => Ok(Grid::Elementwise(args.next().unwrap_or(Expr::Lit(0)))),
        ("tiles", 2) | ("blocks", 2) => {
            let (a, b) = (
                args.next().unwrap_or(Expr::Lit(0)),
                args.next().unwrap_or(Expr::Lit(0)),
            );
            Ok(if rule == "tiles" {
                Grid::Tiles(a, b)
            } else {
                Grid::Blocks(a, b)
            })
        }
        _ => Err(format!("grid: {expected}, found `{text}`")),
    }
}

/// A size, or a tuple of one to three sizes: `(x, y)`.
fn dims(t: &[Tk]) -> Result<Vec<Expr>, String> {
    let tuple = match t {
        [Tk::Punct('('), inner @ .., Tk::Punct(')')] if split(inner, &Tk::Comma).len() > 1 => {
            split(inner, &Tk::Comma)
        }
        _ => vec![t],
    };
    if tuple.len() > 3 {
        return Err(format!(
            "grid: expected one to three counts, found {} in `{}`",
            tuple.len(),
            show(t)
        ));
    }
    tuple.into_iter().map(expr_all).collect()
}

/// A whole expression: all of `t`.
fn expr_all(t: &[Tk]) -> Result<Expr, String> {
    if t.is_empty() {
        return Err("expected a size, found nothing".into());
    }
    let mut at = 0;
    let e = sum(t, &mut at)?;
    if at != t.len() {
        return Err(format!(
            "expected `+`, `-`, `*`, `%` or the end of the size `{}`, found `{}`",
            show(t),
            show(&t[at..at + 1])
        ));
    }
    Ok(e)
}

fn sum(t: &[Tk], at: &mut usize) -> Result<Expr, String> {
    let mut e = product(t, at)?;
    while let Some(Tk::Punct(op @ ('+' | '-'))) = t.get(*at) {
        *at += 1;
        let r = product(t, at)?;
        e = if *op == '+' {
            Expr::Add(Box::new(e), Box::new(r))
        } else {
            Expr::Sub(Box::new(e), Box::new(r))
        };
    }
    Ok(e)
}

fn product(t: &[Tk], at: &mut usize) -> Result<Expr, String> {
    let mut e = atom(t, at)?;
    while let Some(Tk::Punct(op @ ('*' | '%'))) = t.get(*at) {
        *at += 1;
        let r = Box::new(atom(t, at)?);
        e = if *op == '*' {
            Expr::Mul(Box::new(e), r)
        } else {
            Expr::Rem(Box::new(e), r)
        };
    }
    Ok(e)
}

fn atom(t: &[Tk], at: &mut usize) -> Result<Expr, String> {
    let found = t.get(*at).cloned();
    *at += 1;
    match found {
        Some(Tk::Num(v)) => Ok(Expr::Lit(v)),
        Some(Tk::Ident(f))
            if matches!(f.as_str(), "cdiv" | "min" | "max")
                && t.get(*at) == Some(&Tk::Punct('(')) =>
        {
            *at += 1;
            let a = Box::new(sum(t, at)?);
            expect(t, at, Tk::Comma)?;
            let b = Box::new(sum(t, at)?);
            expect(t, at, Tk::Punct(')'))?;
            Ok(match f.as_str() {
                "cdiv" => Expr::CeilDiv(a, b),
                "min" => Expr::Min(a, b),
                _ => Expr::Max(a, b),
            })
        }
        Some(Tk::Ident(n)) => Ok(Expr::Param(n)),
        Some(Tk::Punct('(')) => {
            let e = sum(t, at)?;
            expect(t, at, Tk::Punct(')'))?;
            Ok(e)
        }
        Some(other) => Err(format!(
            "expected a number, a parameter or `(`, found `{}`",
            show(&[other])
        )),
        None => Err(format!(
            "expected a size after `{}`, found nothing",
            show(t)
        )),
    }
}

fn expect(t: &[Tk], at: &mut usize, want: Tk) -> Result<(), String> {
    if t.get(*at) == Some(&want) {
        *at += 1;
        Ok(())
    } else {
        let found = t.get(*at).map_or("nothing".to_string(), |f| {
            format!("`{}`", show(std::slice::from_ref(f)))
        });
        Err(format!(
            "expected `{}` in `{}`, found {found}",
            show(&[want]),
            show(t)
        ))
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tk {
    Ident(String),
    Num(u64),
    Punct(char),
    Comma,
}

fn tokens(s: &str) -> Result<Vec<Tk>, String> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Tk::Ident(chars[start..i].iter().collect()));
        } else if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_alphanumeric() {
                i += 1;
            }
            let text: String = chars[start..i].iter().collect();
            let v = text
                .parse()
                .map_err(|_| format!("expected a decimal number, found `{text}`"))?;
            out.push(Tk::Num(v));
        } else if c == ',' {
            out.push(Tk::Comma);
            i += 1;
        } else if "[]()+-*%=<>".contains(c) {
            out.push(Tk::Punct(c));
            i += 1;
        } else {
            return Err(format!("unexpected `{c}` in `{}`", s.trim()));
        }
    }
    Ok(out)
}

/// Splits at `sep` outside brackets.
fn split<'t>(t: &'t [Tk], sep: &Tk) -> Vec<&'t [Tk]> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, tk) in t.iter().enumerate() {
        match tk {
            Tk::Punct('(' | '[') => depth += 1,
            Tk::Punct(')' | ']') => depth = depth.saturating_sub(1),
            _ if depth == 0 && tk == sep => {
                out.push(&t[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&t[start..]);
    out
}

fn show(t: &[Tk]) -> String {
    let mut s = String::new();
    for (i, tk) in t.iter().enumerate() {
        let piece = match tk {
            Tk::Ident(n) => n.clone(),
            Tk::Num(v) => v.to_string(),
            Tk::Punct(c) => c.to_string(),
            Tk::Comma => ",".into(),
        };
        let prev = i.checked_sub(1).and_then(|j| t.get(j));
        let tight = matches!(tk, Tk::Punct('(' | ')' | '[' | ']') | Tk::Comma)
            || matches!(prev, Some(Tk::Punct('(' | '[')))
            || (*tk == Tk::Punct('=') && prev == Some(&Tk::Punct('>')));
        if i > 0 && !tight {
            s.push(' ');
        }
        s.push_str(&piece);
    }
    s
}
