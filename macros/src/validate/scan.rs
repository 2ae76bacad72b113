//! Host state reached from an op's body, found by reading the body. The body runs once,
//! while the step is captured, and the graph replays only the GPU work it issued: what
//! the body does on the host happens once, and device memory it reaches around its
//! parameters is memory the plan does not order. The runtime refuses the same things
//! where this reading cannot see them (in helper functions, say), so the rules here
//! match only what is unmistakable: no ordinary code is refused.

use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{Expr, Ident, Item, Path, Token, UseTree};

use crate::errors::Errors;
use crate::model::{Op, ParamKind, Step};

/// The `std::mem` functions that move a value out of a place: on a buffer, they change
/// which memory the step's buffers hold after the graph has captured the old addresses.
const MEM_MOVES: [&str; 3] = ["swap", "replace", "take"];

/// The safe accessors of device memory that hand out cudarc's slice or view, with their
/// `unsafe` counterparts for use inside an op.
const CUDA_ACCESSORS: [(&str, &str); 4] = [
    ("as_cuda_slice", "cuda_slice"),
    ("as_cuda_slice_mut", "cuda_slice_mut"),
    ("as_cuda_view", "cuda_view"),
    ("as_cuda_view_mut", "cuda_view_mut"),
];

/// What the module declares that the rules look for in op bodies.
pub struct HostScan {
    /// The `static` items of the module.
    statics: Vec<Ident>,
    /// Names the module's `use`s give `std::mem::{swap, replace, take}`, with the function.
    mem_moves: Vec<(Ident, &'static str)>,
}

impl HostScan {
    pub fn of(step: &Step) -> HostScan {
        let statics = step
            .other
            .iter()
            .filter_map(|item| match item {
                Item::Static(s) => Some(s.ident.clone()),
                _ => None,
            })
            .collect();
        let mut mem_moves = Vec::new();
        for item in &step.other {
            if let Item::Use(u) = item {
                imported_mem_moves(&u.tree, &mut Vec::new(), &mut mem_moves);
            }
        }
        HostScan { statics, mem_moves }
    }

    /// Reports every use of host state in `op`'s body.
    pub fn check(&self, op: &Op, errors: &Errors) {
        let mut mem_moves = self.mem_moves.clone();
        for stmt in &op.item.block.stmts {
            if let syn::Stmt::Item(Item::Use(u)) = stmt {
                imported_mem_moves(&u.tree, &mut Vec::new(), &mut mem_moves);
            }
        }
        let buffers = op
            .params
            .iter()
            .filter(|p| matches!(p.kind, ParamKind::Read | ParamKind::Write))
            .map(|p| p.name.clone())
            .collect();
        let scalars = op
            .params
            .iter()
            .filter(|p| matches!(p.kind, ParamKind::Read | ParamKind::Write))
            .filter(|p| names_type(&p.ty, "DeviceScalars"))
            .map(|p| p.name.clone())
            .collect();
        let mut body = OpBody {
            op,
            statics: &self.statics,
            mem_moves,
            buffers,
            scalars,
            reported: Vec::new(),
            errors,
        };
        body.visit_block(&op.item.block);
    }
}

/// The names a `use` gives `std::mem::{swap, replace, take}` (or `core::mem`'s).
fn imported_mem_moves(
    tree: &UseTree,
    prefix: &mut Vec<String>,
    out: &mut Vec<(Ident, &'static str)>,
) {
    let is_mem = |prefix: &[String]| matches!(prefix, [root, m] if (root == "std" || root == "core") && m == "mem");
    match tree {
        UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            imported_mem_moves(&p.tree, prefix, out);
            prefix.pop();
        }
        UseTree::Group(g) => {
            for t in &g.items {
                imported_mem_moves(t, prefix, out);
            }
        }
        UseTree::Name(n) if is_mem(prefix) => {
            if let Some(f) = MEM_MOVES.iter().find(|f| n.ident == **f) {
                out.push((n.ident.clone(), f));
            }
        }
        UseTree::Rename(r) if is_mem(prefix) => {
            if let Some(f) = MEM_MOVES.iter().find(|f| r.ident == **f) {
                out.push((r.rename.clone(), f));
            }
        }
        _ => {}
    }
}

/// Whether `ty` (behind references) names a type whose last path segment is `name`.
fn names_type(ty: &syn::Type, name: &str) -> bool {
    match ty {
        syn::Type::Reference(r) => names_type(&r.elem, name),
        syn::Type::Paren(p) => names_type(&p.elem, name),
        syn::Type::Group(g) => names_type(&g.elem, name),
        syn::Type::Path(p) => p.path.segments.last().is_some_and(|s| s.ident == name),
        _ => false,
    }
}

/// One op's body being read.
struct OpBody<'a> {
    op: &'a Op,
    statics: &'a [Ident],
    mem_moves: Vec<(Ident, &'static str)>,
    /// The op's buffer parameters.
    buffers: Vec<Ident>,
    /// Those of them that are `DeviceScalars`.
    scalars: Vec<Ident>,
    /// What was reported, once per op: a static's name, or a rule and a name.
    reported: Vec<String>,
    errors: &'a Errors,
}

impl OpBody<'_> {
    /// Reports `message` at `at`, once per op and `key`.
    fn report(&mut self, key: String, at: impl quote::ToTokens, message: String) {
        if !self.reported.contains(&key) {
            self.errors.spanned(at, message);
            self.reported.push(key);
        }
    }

    /// A static of the module, named from an op: host memory the graph cannot replay, or
    /// device memory kept outside the step's buffers, which streams race on unseen.
    fn static_item(&mut self, path: &Path) {
        let segments: Vec<&Ident> = path.segments.iter().map(|s| &s.ident).collect();
        let name = match segments.as_slice() {
            [name] => *name,
            [module, name] if *module == "self" => *name,
            _ => return,
        };
        if path.leading_colon.is_some() || !self.statics.contains(name) {
            return;
        }
        let message = format!(
            "op `{}` uses `{name}`, a static of the step module: the op's body runs once, at capture, and the graph replays only its GPU work, so a value kept in a static is fixed at capture; device memory kept there is outside the step's buffers, so the plan orders no access to it and streams race on it unseen. Keep device memory in a #[buffers] field and values in the #[config] struct",
            self.op.name
        );
        self.report(format!("static {name}"), path, message);
    }

    /// A device or context made (or the devices counted) in an op: it is none of the
    /// step's, so its memory is not in the plan and its work not in the graph.
    fn device_creation(&mut self, path: &Path) {
        let n = path.segments.len();
        if n < 2 {
            return;
        }
        let (ty, f) = (&path.segments[n - 2].ident, &path.segments[n - 1].ident);
        let made = (ty == "Device" && (f == "new" || f == "from_context" || f == "count"))
            || (ty == "CudaContext" && f == "new");
        if !made {
            return;
        }
        let message = format!(
            "op `{}` calls `{ty}::{f}`: an op's body runs once, while the step is captured, and a device or context made or queried there is outside the step (its memory is none the plan orders, and work on it is not in the graph); create devices before `Step::new`, and reach device memory through the op's buffer parameters",
            self.op.name
        );
        self.report(format!("{ty}::{f}"), path, message);
    }

    /// `std::mem::swap` (or `replace`, `take`) on a buffer parameter: it runs once, at
    /// capture, so afterwards the buffers no longer hold the memory the graph replays
    /// on (and a replaced buffer is freed while the graph still uses it).
    fn buffer_move(&mut self, path: &Path, args: &Punctuated<Expr, Token![,]>) {
        let Some(f) = self.mem_move(path) else { return };
        let Some(buffer) = args.iter().find_map(|a| self.buffer_root(a)) else {
            return;
        };
        let message = format!(
            "op `{}` calls `mem::{f}` on its buffer `{buffer}`: the op's body runs once, at capture, so the {f} happens once while the graph keeps the addresses it captured, and afterwards the step's buffers no longer hold what the graph uses; to exchange contents at every replay, copy on the stream, or bind the two buffers to the ops that read and write each",
            self.op.name
        );
        self.report(format!("mem::{f} {buffer}"), path, message);
    }

    /// Which of `swap`, `replace` and `take` `path` calls: `mem::swap`, `std::mem::swap`,
    /// `core::mem::swap`, or a name a `use` gave it.
    fn mem_move(&self, path: &Path) -> Option<&'static str> {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        match segments.as_slice() {
            [name] => self
                .mem_moves
                .iter()
                .find(|(i, _)| i == name)
                .map(|&(_, f)| f),
            [rest @ .., m, f] if m == "mem" && matches!(rest, [] | [_]) => {
                let rooted = rest.iter().all(|r| r == "std" || r == "core");
                MEM_MOVES
                    .iter()
                    .copied()
                    .find(|g| f == g)
                    .filter(|_| rooted)
            }
            _ => None,
        }
    }

    /// The buffer parameter an argument reaches: `x`, `&mut x`, `&mut *x`, `&mut x.w`,
    /// `x.as_mut()`.
    fn buffer_root(&self, expr: &Expr) -> Option<Ident> {
        match expr {
            Expr::Path(p) if p.qself.is_none() => p
                .path
                .get_ident()
                .filter(|i| self.buffers.contains(i))
                .cloned(),
            Expr::Reference(r) => self.buffer_root(&r.expr),
            Expr::Unary(u) => self.buffer_root(&u.expr),
            Expr::Field(f) => self.buffer_root(&f.base),
            Expr::Index(i) => self.buffer_root(&i.expr),
            Expr::MethodCall(m) => self.buffer_root(&m.receiver),
            Expr::Paren(p) => self.buffer_root(&p.expr),
            Expr::Group(g) => self.buffer_root(&g.expr),
            _ => None,
        }
    }

    /// A safe accessor that hands out cudarc's slice, with its stream and context: a
    /// route out of the capture (a synchronise, an allocation, a copy to the host) that
    /// the step does not see.
    fn cuda_accessor(&mut self, method: &Ident) {
        let Some((safe, raw)) = CUDA_ACCESSORS.iter().find(|(safe, _)| method == safe) else {
            return;
        };
        let message = format!(
            "op `{}` calls `{safe}()`: it hands out cudarc's memory with its own stream and context, a route out of the capture (a synchronise, an allocation, a copy to the host) that the step does not see; inside an op, use the `unsafe` `{raw}()` and keep its written contract",
            self.op.name
        );
        self.report(format!("accessor {safe}"), method, message);
    }
}

impl OpBody<'_> {
    /// `scalars.get(i)` on a `DeviceScalars` parameter: the host value, read once at
    /// capture, where every replay's kernels read the device copy its refresh updates.
    fn scalar_read(&mut self, call: &syn::ExprMethodCall) {
        if call.method != "get" {
            return;
        }
        let Some(scalars) = self.buffer_root(&call.receiver) else {
            return;
        };
        if !self.scalars.contains(&scalars) {
            return;
        }
        let message = format!(
            "op `{}` reads the host value of device scalars `{scalars}`: the op's body runs once, at capture, so the value is frozen at what it was then, while every replay's kernels read the device copy (`on_device()`) that `refresh` updates; pass `on_device()` to the kernel instead",
            self.op.name
        );
        self.report(format!("get {scalars}"), &call.method, message);
    }
}

impl<'ast> Visit<'ast> for OpBody<'_> {
    fn visit_expr_path(&mut self, e: &'ast syn::ExprPath) {
        if e.qself.is_none() {
            self.static_item(&e.path);
        }
        visit::visit_expr_path(self, e);
    }

    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        if let Expr::Path(f) = &*call.func {
            self.device_creation(&f.path);
            self.buffer_move(&f.path, &call.args);
            // `DeviceBuffer::as_cuda_slice(x)`, the same call by its path.
            if f.path.segments.len() >= 2
                && let Some(last) = f.path.segments.last()
            {
                self.cuda_accessor(&last.ident);
            }
        }
        visit::visit_expr_call(self, call);
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        self.cuda_accessor(&call.method);
        self.scalar_read(call);
        visit::visit_expr_method_call(self, call);
    }

    /// The arguments of `assert!`, `println!` and the like are expressions too; a macro
    /// whose body is not a list of them is left alone.
    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        if let Ok(args) = mac.parse_body_with(Punctuated::<Expr, Token![,]>::parse_terminated) {
            for arg in &args {
                self.visit_expr(arg);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proc_macro2::TokenStream;
    use quote::quote;

    use crate::validate::tests::errors_of;

    /// The errors of a one-stream step with buffers `x` and `y` and the given items.
    fn errors(items: TokenStream) -> Vec<String> {
        errors_of(
            quote!(streams(main)),
            quote!(mod scan {
                #[buffers]
                pub struct Buffers {
                    pub x: DeviceBuffer<f32>,
                    pub y: DeviceBuffer<f32>,
                }
                #items
            }),
        )
    }

    #[test]
    fn ordinary_host_code_in_an_op_is_no_error() {
        let found = errors(quote! {
            const LIMIT: usize = 4;
            static SHARED: u32 = 0;
            // A helper may do what an op may not: the runtime guards it.
            fn helper(x: &DeviceBuffer<f32>) -> usize {
                let _ = x.as_cuda_slice();
                SHARED as usize
            }
            fn op(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
                let (mut a, mut b) = (1, 2);
                std::mem::swap(&mut a, &mut b);
                let mut v = vec![a, b, LIMIT];
                let taken = std::mem::take(&mut v);
                let _ = core::mem::replace(&mut a, taken.len());
                let mut o = Some(3);
                let _ = o.take();
                let _: Option<&Device> = None;
                assert!(x.len() >= helper(x), "{}", LIMIT);
                s.memset_zeros(x)
            }
        });
        assert!(found.is_empty(), "{found:#?}");
    }

    #[test]
    fn each_way_to_host_state_in_an_op_is_an_error_naming_it() {
        let found = errors(quote! {
            use std::mem::{replace as put, swap};
            static COUNT: AtomicU32 = AtomicU32::new(0);
            static mut RAW: u32 = 0;
            fn op(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>, y: &mut DeviceBuffer<f32>) -> Result<()> {
                println!("{}", self::COUNT.load(Ordering::Relaxed));
                let _ = unsafe { &raw const RAW };
                let _ = cudarc::driver::CudaContext::new(0);
                let _ = stepgraph::Device::count();
                swap(x, y);
                let _ = put(&mut *x, DeviceBuffer::empty());
                let _ = DeviceBuffer::as_cuda_view(y);
                let _ = y.as_cuda_slice_mut();
                s.memset_zeros(x)
            }
        });
        let starts: Vec<&str> = found
            .iter()
            .map(|m| m.split(": ").next().unwrap())
            .collect();
        assert_eq!(
            starts,
            [
                "op `op` uses `COUNT`, a static of the step module",
                "op `op` uses `RAW`, a static of the step module",
                "op `op` calls `CudaContext::new`",
                "op `op` calls `Device::count`",
                "op `op` calls `mem::swap` on its buffer `x`",
                "op `op` calls `mem::replace` on its buffer `x`",
                "op `op` calls `as_cuda_view()`",
                "op `op` calls `as_cuda_slice_mut()`",
            ]
        );
        assert!(
            found[6].contains("the `unsafe` `cuda_view()`"),
            "{}",
            found[6]
        );
    }

    #[test]
    fn a_host_read_of_device_scalars_is_an_error_and_other_gets_are_not() {
        let found = errors_of(
            quote!(streams(main)),
            quote!(
                mod scan {
                    #[buffers]
                    pub struct Buffers {
                        pub x: DeviceBuffer<f32>,
                        pub lr: DeviceScalars<f32>,
                    }
                    fn op(
                        s: &CaptureStream<'_>,
                        lr: &DeviceScalars<f32>,
                        x: &mut DeviceBuffer<f32>,
                    ) -> Result<()> {
                        let sizes = vec![1usize, 2];
                        let _ = sizes.get(0);
                        let _ = lr.get(0)?;
                        s.memset_zeros(x)
                    }
                }
            ),
        );
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(
            found[0].starts_with("op `op` reads the host value of device scalars `lr`"),
            "{found:#?}"
        );
    }

    #[test]
    fn a_static_named_twice_in_one_op_is_one_error() {
        let found = errors(quote! {
            static COUNT: AtomicU32 = AtomicU32::new(0);
            fn op(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
                COUNT.fetch_add(1, Ordering::Relaxed);
                COUNT.fetch_add(1, Ordering::Relaxed);
                s.memset_zeros(x)
            }
        });
        assert_eq!(found.len(), 1, "{found:#?}");
    }
}
