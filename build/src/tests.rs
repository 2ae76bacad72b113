//! Tests of the whole pipeline (with a stand-in nvcc where one runs) and of the generated
//! code. The real nvcc runs in `tests/user_crate.rs`.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::*;

fn param(c_name: &str, c_type: &str, size: usize, rust: &str, pass: Pass) -> ParamModel {
    ParamModel {
        c_name: c_name.into(),
        rust_name: c_name.into(),
        c_type: c_type.into(),
        size,
        rust: rust.into(),
        pass,
        mapped_value: false,
    }
}

/// `k` with `line` as its comment's contract, read as the builder reads it.
fn with_contract(mut k: KernelModel, line: &str) -> KernelModel {
    let views: Vec<contract::ParamView<'_>> = k
        .params
        .iter()
        .map(|p| contract::ParamView {
            c_name: &p.c_name,
            rust: &p.rust,
            pass: p.pass,
            mapped_value: p.mapped_value,
        })
        .collect();
    let c = contract::read(&k.name, Some(line), 9, &views, &BTreeMap::new()).unwrap();
    k.contract = c;
    k
}

/// The registry of a small crate: an elementwise module like stepgraph-kernels' own, and
/// a module with a struct by value, a renamed parameter and a kernel called `load`.
fn sample() -> Registry {
    let axpby = KernelModel {
        name: "axpby".into(),
        variant: "Axpby".into(),
        launcher: "axpby".into(),
        line: 10,
        signature: "__global__ void axpby(const float* __restrict__ x, float* __restrict__ y, unsigned n, float a, float b)".into(),
        comment: Some("y[i] <- a * x[i] + b * y[i]".into()),
        params: vec![
            param("x", "const float*", 8, "f32", Pass::Buf),
            param("y", "float*", 8, "f32", Pass::BufMut),
            param("n", "unsigned", 4, "u32", Pass::Value),
            param("a", "float", 4, "f32", Pass::Value),
            param("b", "float", 4, "f32", Pass::Value),
        ],
        contract: None,
    };
    let axpby = with_contract(
        axpby,
        "stepgraph(unsafe): x[n], y[n], n > 0, grid = elementwise(n)",
    );
    let fill = KernelModel {
        name: "fill_affine".into(),
        variant: "FillAffine".into(),
        launcher: "fill_affine".into(),
        line: 29,
        signature: "__global__ void fill_affine(float* y, unsigned n, float start, float step)"
            .into(),
        comment: None,
        params: vec![
            param("y", "float*", 8, "f32", Pass::BufMut),
            param("n", "unsigned", 4, "u32", Pass::Value),
            param("start", "float", 4, "f32", Pass::Value),
            param("step", "float", 4, "f32", Pass::Value),
        ],
        contract: None,
    };
    // No grid: the safe method takes the caller's config.
    let fill = with_contract(
        fill,
        "stepgraph(unsafe): y[>= cdiv(n, 4) * 4], n % 4 == 0, n <= 1048576",
    );
    let mut adv = param(
        "adv",
        "const BranchIn",
        64,
        "crate::BranchPtrs",
        Pass::Value,
    );
    adv.mapped_value = true;
    let mut stream = param("stream", "int", 4, "i32", Pass::Value);
    stream.rust_name = "stream_".into();
    let load = KernelModel {
        name: "load".into(),
        variant: "Load".into(),
        launcher: "launch_load".into(),
        line: 3,
        signature: "__global__ void load(const BranchIn adv, int stream)".into(),
        comment: None,
        params: vec![adv, stream],
        contract: None,
    };
    // Pointer tables (`struct BranchIn { const float* p[8]; }` unmapped), read and written.
    let sum = KernelModel {
        name: "sum_branches".into(),
        variant: "SumBranches".into(),
        launcher: "sum_branches".into(),
        line: 12,
        signature: "__global__ void sum_branches(BranchIn adv, BranchOut dadv, float* out, unsigned B, unsigned D)".into(),
        comment: None,
        params: vec![
            param("adv", "BranchIn", 64, "f32", Pass::Table { slots: 8, write: false }),
            param("dadv", "BranchOut", 64, "f32", Pass::Table { slots: 8, write: true }),
            param("out", "float*", 8, "f32", Pass::BufMut),
            param("B", "unsigned", 4, "u32", Pass::Value),
            param("D", "unsigned", 4, "u32", Pass::Value),
        ],
        contract: None,
    };
    let sum = with_contract(
        sum,
        "stepgraph(unsafe): adv[D][B], dadv[D][>= 2 * B], out[B], grid = elementwise(B)",
    );
    let image = |kind, target: &str, stem: &str, ext: &str| ImageModel {
        kind,
        target: target.into(),
        file: format!("/stepgraph_kernels/{stem}.{target}.{ext}"),
    };
    Registry {
        rt: "::stepgraph".into(),
        kernel_dir: "cuda".into(),
        nvcc_release: "13.0".into(),
        nvcc_version: "V13.0.88".into(),
        modules: vec![
            ModuleModel {
                name: "elementwise".into(),
                variant: "Elementwise".into(),
                source: "cuda/elementwise.cu".into(),
                images: vec![
                    image(Kind::Cubin, "sm_90", "elementwise", "cubin"),
                    image(Kind::Ptx, "compute_90", "elementwise", "ptx"),
                ],
                kernels: vec![axpby, fill],
            },
            ModuleModel {
                name: "heads".into(),
                variant: "Heads".into(),
                source: "cuda/heads.cu".into(),
                images: vec![image(Kind::Cubin, "sm_90", "heads", "cubin")],
                kernels: vec![load, sum],
            },
        ],
    }
}

fn items(file: &syn::File) -> BTreeMap<String, &syn::Item> {
    let mut out = BTreeMap::new();
    for item in &file.items {
        let name = match item {
            syn::Item::Const(c) => c.ident.to_string(),
            syn::Item::Enum(e) => e.ident.to_string(),
            syn::Item::Static(s) => s.ident.to_string(),
            syn::Item::Struct(s) => s.ident.to_string(),
            _ => continue,
        };
        out.insert(name, item);
    }
    out
}

fn launcher<'f>(file: &'f syn::File, name: &str) -> &'f syn::ImplItemFn {
    file.items
        .iter()
        .filter_map(|i| match i {
            syn::Item::Impl(imp) => Some(imp),
            _ => None,
        })
        .flat_map(|imp| &imp.items)
        .find_map(|i| match i {
            syn::ImplItem::Fn(f) if f.sig.ident == name => Some(f),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no method `{name}`"))
}

fn tokens(t: &impl quote_free::ToText) -> String {
    t.text()
}

/// `syn` without `quote`: enough to print a type or a signature for a comparison.
mod quote_free {
    pub trait ToText {
        fn text(&self) -> String;
    }
    impl ToText for syn::Type {
        fn text(&self) -> String {
            match self {
                syn::Type::Path(p) => path(&p.path),
                syn::Type::Reference(r) => format!(
                    "&{}{}",
                    if r.mutability.is_some() { "mut " } else { "" },
                    r.elem.text()
                ),
                syn::Type::ImplTrait(t) => {
                    let bounds: Vec<String> = t
                        .bounds
                        .iter()
                        .map(|b| match b {
                            syn::TypeParamBound::Trait(tb) => path(&tb.path),
                            other => format!("{other:?}"),
                        })
                        .collect();
                    format!("impl {}", bounds.join(" + "))
                }
                other => format!("{other:?}"),
            }
        }
    }
    fn path(p: &syn::Path) -> String {
        let segs: Vec<String> = p
            .segments
            .iter()
            .map(|s| {
                let args = match &s.arguments {
                    syn::PathArguments::AngleBracketed(a) => {
                        let inner: Vec<String> = a
                            .args
                            .iter()
                            .map(|g| match g {
                                syn::GenericArgument::Type(t) => t.text(),
                                syn::GenericArgument::Lifetime(l) => format!("'{}", l.ident),
                                other => format!("{other:?}"),
                            })
                            .collect();
                        format!("<{}>", inner.join(", "))
                    }
                    _ => String::new(),
                };
                format!("{}{args}", s.ident)
            })
            .collect();
        format!(
            "{}{}",
            if p.leading_colon.is_some() { "::" } else { "" },
            segs.join("::")
        )
    }
}

#[test]
fn generated_code_parses_and_has_the_registry_and_a_typed_launcher_per_kernel() {
    let code = codegen::generate(&sample());
    let file = syn::parse_file(&code).unwrap_or_else(|e| panic!("{e}\n{code}"));
    let items = items(&file);
    for name in [
        "NVCC_RELEASE",
        "NVCC_VERSION",
        "ModuleId",
        "KernelId",
        "MODULES",
        "Kernels",
    ] {
        assert!(items.contains_key(name), "no `{name}`");
    }
    let syn::Item::Enum(kernel_id) = items["KernelId"] else {
        panic!()
    };
    let variants: Vec<String> = kernel_id
        .variants
        .iter()
        .map(|v| v.ident.to_string())
        .collect();
    assert_eq!(variants, ["Axpby", "FillAffine", "Load", "SumBranches"]);
    let syn::Item::Enum(module_id) = items["ModuleId"] else {
        panic!()
    };
    let variants: Vec<String> = module_id
        .variants
        .iter()
        .map(|v| v.ident.to_string())
        .collect();
    assert_eq!(variants, ["Elementwise", "Heads"]);

    let axpby = launcher(&file, "axpby");
    assert!(axpby.sig.unsafety.is_some(), "launchers are unsafe");
    let params: Vec<(String, String)> = axpby
        .sig
        .inputs
        .iter()
        .filter_map(|i| match i {
            syn::FnArg::Typed(t) => {
                let syn::Pat::Ident(id) = &*t.pat else {
                    panic!()
                };
                Some((id.ident.to_string(), tokens(&*t.ty)))
            }
            syn::FnArg::Receiver(_) => None,
        })
        .collect();
    let want = [
        ("stream", "&::stepgraph::__rt_v1::CaptureStream<'_>"),
        ("config", "::stepgraph::__rt_v1::LaunchConfig"),
        ("x", "&impl ::stepgraph::__rt_v1::DeviceMem<f32>"),
        ("y", "&mut impl ::stepgraph::__rt_v1::DeviceMemMut<f32>"),
        ("n", "u32"),
        ("a", "f32"),
        ("b", "f32"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(params, want);
    let docs: Vec<String> = axpby
        .attrs
        .iter()
        .filter_map(|a| match &a.meta {
            syn::Meta::NameValue(nv) if nv.path.is_ident("doc") => match &nv.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => Some(s.value()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    let docs = docs.join("\n");
    assert!(docs.contains("# Safety"), "{docs}");
    assert!(docs.contains("y[i] <- a * x[i] + b * y[i]"), "{docs}");
    assert!(
        docs.contains("__global__ void axpby(const float* __restrict__ x"),
        "{docs}"
    );
    assert!(
        docs.contains("Launches `axpby` (`cuda/elementwise.cu`, line 10)"),
        "{docs}"
    );

    // `load` is taken by `Kernels::load`; `stream` by the launcher's own parameter.
    let load = launcher(&file, "launch_load");
    let names: Vec<String> = load
        .sig
        .inputs
        .iter()
        .filter_map(|i| match i {
            syn::FnArg::Typed(t) => match &*t.pat {
                syn::Pat::Ident(id) => Some(id.ident.to_string()),
                _ => None,
            },
            syn::FnArg::Receiver(_) => None,
        })
        .collect();
    assert_eq!(names, ["stream", "config", "adv", "stream_"]);
    assert!(
        code.contains(".arg(&adv)\n                .arg(&stream_)\n"),
        "{code}"
    );
    // The mapped struct's size is asserted at compile time.
    assert!(
        code.contains("::core::mem::size_of::<crate::BranchPtrs>() == 64"),
        "{code}"
    );
    // Every runtime item goes through the configured path's hidden, versioned module.
    for line in code.lines().filter(|l| l.contains("stepgraph")) {
        let ok = !line.contains("::stepgraph::") || line.contains("::stepgraph::__rt_v1::");
        assert!(ok || line.trim_start().starts_with("//"), "{line}");
    }
}

#[test]
fn a_kernel_with_a_contract_gets_a_safe_checked_method_beside_its_launcher() {
    let code = codegen::generate(&sample());
    let file = syn::parse_file(&code).expect("the generated code parses");
    let safe = launcher(&file, "axpby_checked");
    assert!(safe.sig.unsafety.is_none(), "the checked method is safe");
    assert!(launcher(&file, "axpby").sig.unsafety.is_some());
    let params = |f: &syn::ImplItemFn| -> Vec<(String, String)> {
        f.sig
            .inputs
            .iter()
            .filter_map(|i| match i {
                syn::FnArg::Typed(t) => match &*t.pat {
                    syn::Pat::Ident(id) => Some((id.ident.to_string(), tokens(&*t.ty))),
                    _ => None,
                },
                syn::FnArg::Receiver(_) => None,
            })
            .collect()
    };
    let want = [
        ("stream", "&::stepgraph::__rt_v1::CaptureStream<'_>"),
        ("x", "&::stepgraph::__rt_v1::DeviceBuffer<f32>"),
        ("y", "&mut ::stepgraph::__rt_v1::DeviceBuffer<f32>"),
        ("n", "usize"),
        ("a", "f32"),
        ("b", "f32"),
    ];
    let found = params(safe);
    let found: Vec<(&str, &str)> = found
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    assert_eq!(found, want);
    // Without a grid, the caller's config comes after the stream.
    let fill = params(launcher(&file, "fill_affine_checked"));
    assert_eq!(fill[1].0, "config");
    // A pointer table: the safe method takes a slice of whole buffers and checks their
    // count and lengths; the launcher builds the table (a written one checked against
    // the op's grant) and passes it by value.
    for want in [
        "adv: &[&::stepgraph::__rt_v1::DeviceBuffer<f32>],",
        "dadv: &mut [&mut ::stepgraph::__rt_v1::DeviceBuffer<f32>],",
        "adv: &[&impl ::stepgraph::__rt_v1::DeviceMem<f32>],",
        "dadv: &mut [&mut impl ::stepgraph::__rt_v1::DeviceMemMut<f32>],",
        "let adv = ::stepgraph::__rt_v1::PtrTable::<8>::reads(\"sum_branches: adv\", adv)?;",
        "let dadv = ::stepgraph::__rt_v1::PtrTable::<8>::writes(\"sum_branches: dadv\", dadv)?;",
        "contract::table(\n            \"sum_branches\",\n            \"adv\",\n            \"D\",\n            adv.len(),",
        "contract::at_least(\n                \"sum_branches\",\n                &format!(\"dadv[{i}]\"),\n                \"2 * B\",",
    ] {
        assert!(code.contains(want), "no {want:?} in\n{code}");
    }
    // No contract, no safe method.
    assert!(!code.contains("fn launch_load_checked("));
    // The helpers and grid rules, once.
    assert_eq!(code.matches("pub mod contract {").count(), 1);
    let mut plain = sample();
    for m in &mut plain.modules {
        for k in &mut m.kernels {
            k.contract = None;
        }
    }
    assert!(!codegen::generate(&plain).contains("mod contract"));
}

#[test]
fn the_runtime_path_is_configurable() {
    let mut r = sample();
    r.rt = "::my_framework::stepgraph".into();
    let code = codegen::generate(&r);
    syn::parse_file(&code).unwrap();
    assert!(code.contains("&::my_framework::stepgraph::__rt_v1::CaptureStream<'_>"));
    assert!(!code.contains(" ::stepgraph::"), "{code}");
}

/// The generated file for [`sample`], reviewed like code. Regenerate with
/// `STEPGRAPH_BLESS=1 cargo test -p stepgraph-build` and review the diff.
#[test]
fn generated_code_snapshot() {
    let code = codegen::generate(&sample());
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/registry.rs");
    if std::env::var_os("STEPGRAPH_BLESS").is_some() {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, &code).unwrap();
        return;
    }
    let expected = fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "no snapshot at {}: run with STEPGRAPH_BLESS=1 and review it",
            path.display()
        )
    });
    if expected != code {
        let first = expected
            .lines()
            .zip(code.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(expected.lines().count().min(code.lines().count()));
        panic!(
            "the generated code changed from line {}:\n  expected: {:?}\n  found:    {:?}\nrun with STEPGRAPH_BLESS=1 and review the diff",
            first + 1,
            expected.lines().nth(first),
            code.lines().nth(first)
        );
    }
}

/// A crate layout in a temporary folder: `cuda/` with the given files.
struct Crate {
    dir: tempfile::TempDir,
}

impl Crate {
    fn new(files: &[(&str, &str)]) -> Crate {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            let path = dir.path().join(name);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        }
        fs::create_dir_all(dir.path().join("out")).unwrap();
        Crate { dir }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn vars(&self, extra: &[(&str, &Path)]) -> BTreeMap<String, OsString> {
        let mut vars: BTreeMap<String, OsString> = BTreeMap::new();
        vars.insert("CARGO_MANIFEST_DIR".into(), self.root().into());
        vars.insert("OUT_DIR".into(), self.root().join("out").into());
        vars.insert("NUM_JOBS".into(), "2".into());
        for (k, v) in extra {
            vars.insert(k.to_string(), v.into());
        }
        vars
    }
}

#[test]
fn a_struct_without_a_mapping_fails_before_nvcc_naming_file_line_kernel_parameter_and_fix() {
    let krate = Crate::new(&[
        (
            "cuda/common.cuh",
            "#pragma once\nstruct BranchIn {\n    const float* p[8];\n    unsigned n;\n};\n",
        ),
        (
            "cuda/heads.cu",
            "#include \"common.cuh\"\n\n// Sums the branches.\nextern \"C\" __global__ void sum_branches(const BranchIn adv,\n                                         float* out, unsigned n) {}\n",
        ),
    ]);
    // No nvcc anywhere: the signature is refused before one is looked for.
    let vars = krate.vars(&[("NVCC", &krate.root().join("no-nvcc"))]);
    let cargo = Cargo::with_vars(&vars);
    let errors = Builder::new().run_with(&cargo).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with(
            "cuda/heads.cu:4: kernel `sum_branches`, parameter 0 `adv` (`const BranchIn adv`): \
             `BranchIn` is a struct (cuda/common.cuh:2) passed by value"
        ),
        "{}",
        errors[0]
    );
    assert!(
        errors[0].ends_with("`Builder::new().rust_type(\"BranchIn\", \"crate::BranchIn\")`"),
        "{}",
        errors[0]
    );
    let d = cargo.directives();
    for path in ["cuda", "cuda/heads.cu", "cuda/common.cuh"] {
        let line = format!(
            "cargo::rerun-if-changed={}",
            krate.root().join(path).display()
        );
        assert!(d.contains(&line), "{line} not in {d:?}");
    }
}

#[cfg(unix)]
mod with_a_stand_in_nvcc {
    use super::*;

    /// A shell script that answers `--version` and writes `ptx` (or a fake cubin) to
    /// `-o`, a dependency file naming `header` to `-MF`, and a warning.
    fn fake_nvcc(dir: &Path, ptx: &str, header: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        let ptx_file = dir.join("canned.ptx");
        fs::write(&ptx_file, ptx).unwrap();
        let script = format!(
            "#!/bin/sh\n\
             if [ \"$1\" = \"--version\" ]; then echo 'Cuda compilation tools, release 12.4, V12.4.131'; exit 0; fi\n\
             out=''; dep=''; src=''\n\
             while [ $# -gt 0 ]; do case \"$1\" in -o) out=\"$2\"; shift;; -MF) dep=\"$2\"; shift;; *) src=\"$1\";; esac; shift; done\n\
             case \"$out\" in *.ptx) cat '{}' > \"$out\";; *) printf 'CUBIN' > \"$out\";; esac\n\
             if [ -n \"$dep\" ]; then printf '%s : %s \\\\\\n  %s\\n' \"$out\" \"$src\" '{}' > \"$dep\"; fi\n\
             echo \"$src(3): warning: something to say\" >&2\n",
            ptx_file.display(),
            header.display()
        );
        let path = dir.join("nvcc");
        fs::write(&path, script).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    const SOURCE: &str = "#include \"common.cuh\"\n// y <- 2 y\nextern \"C\" __global__ void twice(float* y, unsigned n) {}\n";
    const PTX: &str = ".version 8.4\n.target sm_90\n.visible .entry twice(\n\t.param .u64 twice_param_0,\n\t.param .u32 twice_param_1\n)\n{\n}\n";

    #[test]
    fn compiles_embeds_nul_terminated_ptx_tracks_headers_and_forwards_warnings() {
        let krate = Crate::new(&[
            ("cuda/common.cuh", "#pragma once\n"),
            ("cuda/ops.cu", SOURCE),
        ]);
        let header = krate.root().join("cuda/common.cuh");
        let nvcc = fake_nvcc(krate.root(), PTX, &header);
        let vars = krate.vars(&[("NVCC", &nvcc)]);
        let cargo = Cargo::with_vars(&vars);
        Builder::new().run_with(&cargo).unwrap();
        let out = krate.root().join("out");
        let code = fs::read_to_string(out.join("stepgraph_kernels.rs")).unwrap();
        syn::parse_file(&code).unwrap();
        assert!(
            code.contains("pub const NVCC_RELEASE: &str = \"12.4\";"),
            "{code}"
        );
        assert!(code.contains("pub const NVCC_VERSION: &str = \"V12.4.131\";"));
        // The default targets: a cubin per generation from Ampere on, and compute_80 PTX.
        for cubin in ["sm_80", "sm_86", "sm_89", "sm_90"] {
            assert!(
                code.contains(&format!("\"/stepgraph_kernels/ops.{cubin}.cubin\"")),
                "{cubin}: {code}"
            );
        }
        assert!(
            code.contains("ParamDecl::new(\"n\", \"unsigned\", 4)"),
            "{code}"
        );
        let ptx = fs::read(out.join("stepgraph_kernels/ops.compute_80.ptx")).unwrap();
        assert_eq!(ptx.last(), Some(&0), "PTX is NUL-terminated");
        assert_eq!(ptx.iter().filter(|&&b| b == 0).count(), 1);
        let d = cargo.directives();
        let has = |s: &str| d.iter().any(|l| l == s);
        assert!(
            has(&format!("cargo::rerun-if-changed={}", header.display())),
            "{d:?}"
        );
        assert!(
            has(&format!("cargo::rerun-if-changed={}", nvcc.display())),
            "{d:?}"
        );
        assert!(has("cargo::rerun-if-env-changed=NVCC"));
        assert!(has("cargo::rerun-if-env-changed=NVCC_CCBIN"));
        assert!(has("cargo::rerun-if-env-changed=STEPGRAPH_CUDA_ARCH"));
        // The same warning from the cubin and the PTX run is forwarded once.
        let warnings: Vec<&String> = d
            .iter()
            .filter(|l| l.starts_with("cargo::warning="))
            .collect();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].ends_with("ops.cu(3): warning: something to say"));

        // The environment variable replaces the targets; a cubin-only build still checks
        // against PTX it does not embed.
        let vars = krate.vars(&[
            ("NVCC", &nvcc),
            ("STEPGRAPH_CUDA_ARCH", Path::new("sm_80,sm_90")),
        ]);
        Builder::new().run_with(&Cargo::with_vars(&vars)).unwrap();
        let code = fs::read_to_string(out.join("stepgraph_kernels.rs")).unwrap();
        let images: Vec<&str> = code.lines().filter(|l| l.contains("Image::")).collect();
        assert_eq!(images.len(), 2, "{images:?}");
        assert!(code.find("\"sm_90\"").unwrap() < code.find("\"sm_80\"").unwrap());
        assert!(
            out.join("stepgraph_kernels/ops.compute_90.check.ptx")
                .is_file()
        );
        let vars = krate.vars(&[("NVCC", &nvcc), ("STEPGRAPH_CUDA_ARCH", Path::new("sm90"))]);
        let e = Builder::new()
            .run_with(&Cargo::with_vars(&vars))
            .unwrap_err();
        assert!(
            e[0].starts_with("STEPGRAPH_CUDA_ARCH: `sm90` is not a CUDA target"),
            "{e:?}"
        );
    }

    #[test]
    fn a_size_the_ptx_disagrees_with_is_an_error_naming_kernel_and_parameter() {
        // `u32` is a macro that nvcc expands to a 64-bit type: the scan cannot know.
        let src = "#define u32 unsigned long long\nextern \"C\" __global__ void twice(float* y, u32 n) {}\n";
        let krate = Crate::new(&[("cuda/ops.cu", src)]);
        let nvcc = fake_nvcc(
            krate.root(),
            &PTX.replace(".u32 twice_param_1", ".u64 twice_param_1"),
            &krate.root().join("cuda/ops.cu"),
        );
        let vars = krate.vars(&[("NVCC", &nvcc)]);
        // A mapped type's size comes from the PTX, and a compile-time assertion in the
        // generated code checks the Rust type against it.
        let map = Builder::new().rust_type("u32", "u64");
        map.run_with(&Cargo::with_vars(&vars)).unwrap();
        let code = fs::read_to_string(krate.root().join("out/stepgraph_kernels.rs")).unwrap();
        assert!(
            code.contains("::core::mem::size_of::<u64>() == 8"),
            "{code}"
        );
        assert!(code.contains("ParamDecl::new(\"n\", \"u32\", 8)"), "{code}");

        // A built-in type whose size the PTX disagrees with.
        let src = "extern \"C\" __global__ void twice(float* y, unsigned n) {}\n";
        fs::write(krate.root().join("cuda/ops.cu"), src).unwrap();
        let e = Builder::new()
            .run_with(&Cargo::with_vars(&vars))
            .unwrap_err();
        assert_eq!(
            e,
            [
                "cuda/ops.cu:1: kernel `twice`, parameter 1 `n` (`unsigned n`): stepgraph-build \
              reads `unsigned` as 4 bytes, and the PTX nvcc wrote has 8. Map the type to a Rust \
              type of 8 bytes with `Builder::rust_type`."
            ]
        );
    }

    #[test]
    fn a_parameter_count_the_ptx_disagrees_with_is_an_error() {
        let krate = Crate::new(&[(
            "cuda/ops.cu",
            "extern \"C\" __global__ void twice(float* y, unsigned n, float s) {}\n",
        )]);
        let nvcc = fake_nvcc(krate.root(), PTX, &krate.root().join("cuda/ops.cu"));
        let vars = krate.vars(&[("NVCC", &nvcc)]);
        let e = Builder::new()
            .run_with(&Cargo::with_vars(&vars))
            .unwrap_err();
        assert_eq!(
            e,
            [
                "cuda/ops.cu:1: kernel `twice` has 3 parameters in the source as stepgraph-build \
              reads it, and 2 in the PTX nvcc wrote (a macro in the parameter list?)"
            ]
        );
    }

    #[test]
    fn kernels_nvcc_leaves_out_or_the_scan_misses_are_warnings() {
        let src = "#if 0\nextern \"C\" __global__ void old(float* y) {}\n#endif\n\
                   extern \"C\" __global__ void twice(float* y, unsigned n) {}\n";
        let krate = Crate::new(&[("cuda/ops.cu", src)]);
        let ptx = format!("{PTX}.visible .entry from_macro(\n)\n{{\n}}\n");
        let nvcc = fake_nvcc(krate.root(), &ptx, &krate.root().join("cuda/ops.cu"));
        let vars = krate.vars(&[("NVCC", &nvcc)]);
        let cargo = Cargo::with_vars(&vars);
        Builder::new().run_with(&cargo).unwrap();
        let code = fs::read_to_string(krate.root().join("out/stepgraph_kernels.rs")).unwrap();
        assert!(code.contains("pub unsafe fn twice("));
        assert!(!code.contains("fn old(") && !code.contains("fn from_macro("));
        let warnings: Vec<String> = cargo
            .directives()
            .into_iter()
            .filter(|d| d.starts_with("cargo::warning=cuda/"))
            .collect();
        assert_eq!(
            warnings,
            [
                "cargo::warning=cuda/ops.cu:2: kernel `old` is not in the module nvcc compiled \
                 (inside an `#if` that is off?): it gets no KernelId or launcher",
                "cargo::warning=cuda/ops.cu: the compiled module has a kernel `from_macro` that \
                 stepgraph-build did not find in the source (declared through a macro?): it has \
                 no KernelId or launcher; look it up with `Module::kernel`"
            ]
        );
    }

    #[test]
    fn an_nvcc_older_than_the_minimum_is_refused() {
        let krate = Crate::new(&[("cuda/ops.cu", SOURCE)]);
        let nvcc = fake_nvcc(krate.root(), PTX, &krate.root().join("cuda/ops.cu"));
        let vars = krate.vars(&[("NVCC", &nvcc)]);
        let e = Builder::new()
            .min_nvcc_version(12, 8)
            .run_with(&Cargo::with_vars(&vars))
            .unwrap_err();
        assert_eq!(
            e,
            [format!(
                "{} (found through NVCC) is nvcc 12.4; this crate's kernels need nvcc 12.8 or \
                 newer (`Builder::min_nvcc_version`). Point NVCC at a newer nvcc.",
                nvcc.display()
            )]
        );
    }

    #[test]
    fn headers_exported_by_dependencies_are_on_the_include_path() {
        let krate = Crate::new(&[("cuda/ops.cu", SOURCE)]);
        let nvcc = fake_nvcc(krate.root(), PTX, &krate.root().join("cuda/ops.cu"));
        let dep = krate.root().join("dep/cuda");
        fs::create_dir_all(&dep).unwrap();
        fs::write(dep.join("common.cuh"), "typedef unsigned my_u32;\n").unwrap();
        let vars = krate.vars(&[("NVCC", &nvcc), ("DEP_MY_KERNELS_CUDA_INCLUDE", &dep)]);
        let cargo = Cargo::with_vars(&vars);
        Builder::new().run_with(&cargo).unwrap();
        // Found through the exported folder: its header is tracked.
        let line = format!(
            "cargo::rerun-if-changed={}",
            dep.join("common.cuh").display()
        );
        assert!(
            cargo.directives().contains(&line),
            "{:?}",
            cargo.directives()
        );
        // And a crate with `links` exports its own folder.
        let mut vars = vars.clone();
        vars.insert("CARGO_MANIFEST_LINKS".into(), "mine".into());
        let cargo = Cargo::with_vars(&vars);
        Builder::new().run_with(&cargo).unwrap();
        let line = format!(
            "cargo::metadata=cuda_include={}",
            krate.root().join("cuda").display()
        );
        assert!(
            cargo.directives().contains(&line),
            "{:?}",
            cargo.directives()
        );
    }
}

mod contracts {
    use super::*;
    use contract::{Contract, ContractError, Expr, Grid, Len, ParamView};

    /// `glu_forward(const float* u, float* g, unsigned n, unsigned width, float a)`.
    fn params() -> Vec<ParamView<'static>> {
        let p = |c_name, rust, pass| ParamView {
            c_name,
            rust,
            pass,
            mapped_value: false,
        };
        vec![
            p("u", "f32", Pass::Buf),
            p("g", "f32", Pass::BufMut),
            p("n", "u32", Pass::Value),
            p("width", "u32", Pass::Value),
            p("a", "f32", Pass::Value),
        ]
    }

    /// The contract in `comment`, which ends on line 20, in a file that defines
    /// `LOSS_SLOTS` (8) and `n` (a parameter's name, which the parameter shadows).
    fn read(comment: &str) -> Result<Option<Contract>, Vec<ContractError>> {
        let constants = BTreeMap::from([("LOSS_SLOTS".to_string(), 8), ("n".to_string(), 3)]);
        contract::read("glu_forward", Some(comment), 20, &params(), &constants)
    }

    /// `sum_branches(BranchIn adv, BranchOut dadv, float* out, unsigned B, unsigned D)`:
    /// its errors, or its contract.
    fn read_tables(comment: &str) -> Result<Option<Contract>, Vec<ContractError>> {
        let p = |c_name, pass| ParamView {
            c_name,
            rust: if pass == Pass::Value { "u32" } else { "f32" },
            pass,
            mapped_value: false,
        };
        let params = [
            p(
                "adv",
                Pass::Table {
                    slots: 8,
                    write: false,
                },
            ),
            p(
                "dadv",
                Pass::Table {
                    slots: 8,
                    write: true,
                },
            ),
            p("out", Pass::BufMut),
            p("B", Pass::Value),
            p("D", Pass::Value),
        ];
        contract::read("sum_branches", Some(comment), 5, &params, &BTreeMap::new())
    }

    #[test]
    fn a_table_takes_a_count_and_each_buffers_length_and_nothing_else() {
        let c = read_tables("stepgraph(unsafe): adv[D][B * 2], dadv[D][>= B], out[B]")
            .unwrap()
            .unwrap();
        let b = || Box::new(Expr::Param("B".into()));
        let d = || Expr::Param("D".into());
        assert_eq!(
            c.tables,
            [
                (
                    "adv".to_string(),
                    d(),
                    Len::Exactly(Expr::Mul(b(), Box::new(Expr::Lit(2))))
                ),
                ("dadv".to_string(), d(), Len::AtLeast(*b())),
            ]
        );
        let cases: &[(&str, &str)] = &[
            (
                "adv[D], dadv[D][B], out[B]",
                "`adv` is a table of up to 8 buffers: give their count and each one's length, \
                 `adv[<count>][<size>]`",
            ),
            (
                "adv[D][B], dadv[D][B], out[D][B]",
                "`out[..][..]` describes a table of buffers, but `out` is one buffer: a struct \
                 that holds one array of pointers is one",
            ),
            (
                "adv[D][B], dadv[D][B], out[B], B[1][2]",
                "`B[..][..]` describes a table of buffers, but `B` is a value: a struct that \
                 holds one array of pointers is one",
            ),
            (
                "adv[D][B], adv[D][B], dadv[D][B], out[B]",
                "table `adv` has two lengths",
            ),
            (
                "dadv[D][B], out[B]",
                "the contract gives no count and length for pointer table `adv`: add \
                 `adv[<count>][<size>]`",
            ),
            (
                "adv[D]x[B], dadv[D][B], out[B]",
                "expected `buffer[size]` or `table[count][size]`, found `adv[D] x[B]`",
            ),
            (
                "adv[out][B], dadv[D][B], out[B]",
                "expected an integer parameter as a size, found `out`, a buffer",
            ),
        ];
        for (items, message) in cases {
            let comment = format!("stepgraph(unsafe): {items}");
            let errors = read_tables(&comment).unwrap_err();
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert_eq!(
                errors[0].message,
                format!("kernel `sum_branches`: {message}"),
                "for {items:?}"
            );
        }
    }

    /// The one error `comment` gives: its line and message.
    fn error(comment: &str) -> (u32, String) {
        let errors = read(comment).unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        (errors[0].line, errors[0].message.clone())
    }

    fn n() -> Box<Expr> {
        Box::new(Expr::Param("n".into()))
    }

    #[test]
    fn a_contract_reads_lengths_positives_and_the_grid_over_several_lines() {
        let c = read(
            "GLU, forward.\n\
             stepgraph(unsafe): u[2 * n], width > 0,\n\
             stepgraph(unsafe): g[>= (n + 1) * cdiv(width, 4)], grid = tiles(cdiv(n, 32), 1)",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            c.lens,
            [
                (
                    "u".to_string(),
                    Len::Exactly(Expr::Mul(Box::new(Expr::Lit(2)), n()))
                ),
                (
                    "g".to_string(),
                    Len::AtLeast(Expr::Mul(
                        Box::new(Expr::Add(n(), Box::new(Expr::Lit(1)))),
                        Box::new(Expr::CeilDiv(
                            Box::new(Expr::Param("width".into())),
                            Box::new(Expr::Lit(4))
                        ))
                    ))
                ),
            ]
        );
        assert_eq!(c.positive, ["width"]);
        assert_eq!(
            c.grid,
            Some(Grid::Tiles(
                Expr::CeilDiv(n(), Box::new(Expr::Lit(32))),
                Expr::Lit(1)
            ))
        );
        assert_eq!(
            c.text,
            [
                "u[2 * n], width > 0,",
                "g[>= (n + 1) * cdiv(width, 4)], grid = tiles(cdiv(n, 32), 1)"
            ]
        );
        let (Len::Exactly(e) | Len::AtLeast(e)) = &c.lens[1].1;
        assert_eq!(e.text(), "(n + 1) * cdiv(width, 4)");
        assert_eq!(
            Expr::Sub(n(), Box::new(Expr::Sub(n(), n()))).text(),
            "n - (n - n)",
            "a right operand of the same precedence keeps its parentheses"
        );
    }

    #[test]
    fn a_contract_reads_conditions_and_a_launch_grid() {
        let c = read(
            "stepgraph(unsafe): u[n], g[n], width <= 8 * LOSS_SLOTS, n % 4 == 0, n >= width,\n\
             stepgraph(unsafe): grid = launch((cdiv(n, 64), width), (32, 8))",
        )
        .unwrap()
        .unwrap();
        let width = || Expr::Param("width".into());
        let texts: Vec<String> = c.conditions.iter().map(contract::Cond::text).collect();
        assert_eq!(
            texts,
            ["width <= 8 * LOSS_SLOTS", "n % 4 == 0", "n >= width"]
        );
        assert_eq!(
            c.conditions[1],
            contract::Cond {
                lhs: Expr::Rem(n(), Box::new(Expr::Lit(4))),
                cmp: contract::Cmp::Eq,
                rhs: Expr::Lit(0),
            }
        );
        assert_eq!(
            c.conditions[0].rhs,
            Expr::Mul(
                Box::new(Expr::Lit(8)),
                Box::new(Expr::Const("LOSS_SLOTS".into(), 8))
            )
        );
        assert_eq!(
            c.grid,
            Some(Grid::Launch(
                vec![Expr::CeilDiv(n(), Box::new(Expr::Lit(64))), width()],
                vec![Expr::Lit(32), Expr::Lit(8)]
            ))
        );
        let c = read("stepgraph(unsafe): u[n], g[max(n, 1) * min(width, LOSS_SLOTS)]")
            .unwrap()
            .unwrap();
        let (Len::Exactly(e) | Len::AtLeast(e)) = &c.lens[1].1;
        assert_eq!(e.text(), "max(n, 1) * min(width, LOSS_SLOTS)");
        assert_eq!(
            *e,
            Expr::Mul(
                Box::new(Expr::Max(n(), Box::new(Expr::Lit(1)))),
                Box::new(Expr::Min(
                    Box::new(width()),
                    Box::new(Expr::Const("LOSS_SLOTS".into(), 8))
                ))
            )
        );
        // A parenthesised size is a size, not a tuple of one.
        let c = read("stepgraph(unsafe): u[n], g[n], grid = launch((n + 1) * 2, 256)")
            .unwrap()
            .unwrap();
        assert_eq!(
            c.grid,
            Some(Grid::Launch(
                vec![Expr::Mul(
                    Box::new(Expr::Add(n(), Box::new(Expr::Lit(1)))),
                    Box::new(Expr::Lit(2))
                )],
                vec![Expr::Lit(256)]
            ))
        );
    }

    #[test]
    fn an_integer_define_is_a_size_and_a_parameter_shadows_one() {
        let c = read("stepgraph(unsafe): u[n * LOSS_SLOTS], g[n], grid = blocks(1, LOSS_SLOTS)")
            .unwrap()
            .unwrap();
        let lits = Expr::Mul(n(), Box::new(Expr::Const("LOSS_SLOTS".into(), 8)));
        assert_eq!(c.lens[0], ("u".to_string(), Len::Exactly(lits.clone())));
        assert_eq!(lits.text(), "n * LOSS_SLOTS");
        assert_eq!(
            c.grid,
            Some(Grid::Blocks(
                Expr::Lit(1),
                Expr::Const("LOSS_SLOTS".into(), 8)
            ))
        );
        assert_eq!(
            error("stepgraph(unsafe): u[n], g[n * LOSS]").1,
            "kernel `glu_forward`: expected an integer `#define` or a parameter of the kernel \
             (u, g, n, width, a), found `LOSS`"
        );
    }

    #[test]
    fn the_integer_defines_of_a_file_are_read() {
        let mut d = BTreeMap::new();
        integer_defines(
            "#define A 8\n  #define B (16u) // sixteen\n#define F(x) 2\n#define S \"s\"\n\
             #define A 9\n#define LONG 1ULL\n",
            &mut d,
        );
        assert_eq!(
            d,
            BTreeMap::from([
                ("A".to_string(), 8),
                ("B".to_string(), 16),
                ("LONG".to_string(), 1)
            ])
        );
    }

    #[test]
    fn a_comment_without_a_contract_line_has_none() {
        assert_eq!(read("y <- 2 y\nstepgraph makes it safe").unwrap(), None);
        assert_eq!(
            contract::read("glu_forward", None, 20, &params(), &BTreeMap::new()).unwrap(),
            None
        );
    }

    #[test]
    fn each_mistake_is_an_error_at_its_line_saying_what_was_expected_and_found() {
        let cases: &[(&str, u32, &str)] = &[
            (
                "stepgraph: u[n], g[n]",
                20,
                "expected a contract line starting `stepgraph(unsafe):`, found `stepgraph: u[n], g[n]` \
                 (the `unsafe` says that the kernel keeps inside these lengths, which the \
                 builder cannot check)",
            ),
            (
                "about it\nstepgraph(unsafe): u[n], g[n], q[n]\nmore",
                19,
                "expected a parameter of the kernel (u, g, n, width, a), found `q`",
            ),
            (
                "stepgraph(unsafe): u[n], g[n], n[1]",
                20,
                "`n[..]` gives a length, but `n` is a value, not a buffer",
            ),
            (
                "stepgraph(unsafe): u[n], g[n], u[n]",
                20,
                "buffer `u` has two lengths",
            ),
            (
                "stepgraph(unsafe): u[a], g[n]",
                20,
                "expected an integer parameter as a size, found `a`, a `f32`",
            ),
            (
                "stepgraph(unsafe): u[n], g[u]",
                20,
                "expected an integer parameter as a size, found `u`, a buffer",
            ),
            (
                "stepgraph(unsafe): u[n], g[n], a > 0",
                20,
                "expected an integer parameter as a size, found `a`, a `f32`",
            ),
            (
                "stepgraph(unsafe): u[n n], g[n]",
                20,
                "expected `+`, `-`, `*`, `%` or the end of the size `n n`, found `n`",
            ),
            (
                "stepgraph(unsafe): u[n / 2], g[n]",
                20,
                "unexpected `/` in `u[n / 2], g[n]`",
            ),
            (
                "stepgraph(unsafe): u[n], g[n], n < 1",
                20,
                "expected `buffer[size]`, `buffer[>= size]`, `table[count][size]`, `size > 0`, \
                 a condition such as `a <= b` or `grid = ...`, found `n < 1`",
            ),
            (
                "stepgraph(unsafe): u[n], g[n], a <= n",
                20,
                "expected an integer parameter as a size, found `a`, a `f32`",
            ),
            (
                "stepgraph(unsafe): u[n], g[n], n <= WIDE",
                20,
                "expected an integer `#define` or a parameter of the kernel (u, g, n, width, a), \
                 found `WIDE`",
            ),
            (
                "stepgraph(unsafe): u[n], g[n], grid = launch(n)",
                20,
                "grid: expected `launch(grid, block)`, two sizes or tuples, found `launch(n)`",
            ),
            (
                "stepgraph(unsafe): u[n], g[n], grid = launch((n, n, n, n), 32)",
                20,
                "grid: expected one to three counts, found 4 in `(n, n, n, n)`",
            ),
            (
                "stepgraph(unsafe): u[n], g[n],, n > 0",
                20,
                "expected an item, found an empty one in `u[n], g[n],, n > 0`",
            ),
            (
                "stepgraph(unsafe): u[n], g[n], grid = warps(n)",
                20,
                "grid: expected `elementwise(count)`, `tiles(x, y)`, `blocks(count, threads)` or \
                 `launch(grid, block)`, found `warps(n)`",
            ),
            (
                "stepgraph(unsafe): u[n], g[n], grid = elementwise(n, 4)",
                20,
                "grid: expected `elementwise(count)`, `tiles(x, y)`, `blocks(count, threads)` or \
                 `launch(grid, block)`, found `elementwise(n, 4)`",
            ),
            (
                "stepgraph(unsafe): u[n], g[n], grid = elementwise(n), grid = elementwise(n)",
                20,
                "two grids: declare one `grid = ...`",
            ),
            (
                "stepgraph(unsafe): u[cdiv(n 4)], g[n]",
                20,
                "expected `,` in `cdiv(n 4)`, found `4`",
            ),
            (
                "stepgraph(unsafe): u[n]",
                20,
                "the contract gives no length for buffer `g`: add `g[<size>]` (or `g[>= <size>]`)",
            ),
        ];
        for (comment, line, message) in cases {
            let (at, found) = error(comment);
            assert_eq!(
                found,
                format!("kernel `glu_forward`: {message}"),
                "for {comment:?}"
            );
            assert_eq!(at, *line, "for {comment:?}");
        }
    }

    #[test]
    fn a_struct_by_value_cannot_have_a_contract() {
        let adv = ParamView {
            c_name: "adv",
            rust: "crate::BranchPtrs",
            pass: Pass::Value,
            mapped_value: true,
        };
        let errors = contract::read(
            "head",
            Some("stepgraph(unsafe): grid = elementwise(1)"),
            3,
            &[adv],
            &BTreeMap::new(),
        )
        .unwrap_err();
        assert_eq!(
            errors[0].message,
            "kernel `head`: parameter `adv` is a `crate::BranchPtrs` by value, whose contents a \
             contract cannot check: launch this kernel with its unsafe launcher"
        );
    }

    #[test]
    fn the_builder_refuses_a_bad_contract_before_nvcc_naming_file_and_line() {
        let krate = Crate::new(&[(
            "cuda/scale.cu",
            "// Scales x.\n// stepgraph(unsafe): x[n], grid = elementwise(m)\nextern \"C\" __global__ void scale(float* x, unsigned n) {}\n",
        )]);
        let vars = krate.vars(&[("NVCC", &krate.root().join("no-nvcc"))]);
        let cargo = Cargo::with_vars(&vars);
        let errors = Builder::new().run_with(&cargo).unwrap_err();
        assert_eq!(
            errors,
            [
                "cuda/scale.cu:2: kernel `scale`: expected an integer `#define` or a parameter of \
                 the kernel (x, n), found `m`"
            ]
        );
    }

    #[test]
    fn a_safe_method_whose_name_is_another_kernels_launcher_is_refused() {
        let krate = Crate::new(&[(
            "cuda/scale.cu",
            "// stepgraph(unsafe): x[n], grid = elementwise(n)\nextern \"C\" __global__ void scale(float* x, unsigned n) {}\n\
             extern \"C\" __global__ void scale_checked(float* x, unsigned n) {}\n",
        )]);
        let vars = krate.vars(&[("NVCC", &krate.root().join("no-nvcc"))]);
        let errors = Builder::new()
            .run_with(&Cargo::with_vars(&vars))
            .unwrap_err();
        assert_eq!(
            errors,
            [
                "cuda/scale.cu:2: kernel `scale` has a contract, so it gets the safe method \
              `scale_checked`, which is kernel `scale_checked`'s launcher: rename one"
            ]
        );
    }
}
