//! From a C parameter type to the Rust type its launcher takes, and its size.

use std::collections::BTreeMap;

use crate::parse::{BUILTIN_WORDS, ParamSig, PtrTableDecl, Typedef};

/// How a launcher passes an argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    /// `const T*`: `&impl DeviceMem<T>` (a buffer or a view).
    Buf,
    /// `T*`: `&mut impl DeviceMemMut<T>`.
    BufMut,
    /// By value.
    Value,
    /// A struct of one array of `slots` device pointers (`struct BranchIn { const float*
    /// p[8]; }`), filled from a slice of buffers; `write` when the pointee is not const.
    Table { slots: usize, write: bool },
}

/// A parameter's Rust side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RustParam {
    /// The element type for a pointer, the value's type otherwise.
    pub rust: String,
    pub pass: Pass,
    /// Bytes the kernel takes, when known without the PTX (not for a mapped type passed
    /// by value).
    pub size: Option<usize>,
}

/// What a type can resolve through.
#[derive(Debug)]
pub(crate) struct TypeEnv<'a> {
    /// `Builder::rust_type`: C spelling to Rust path.
    pub mappings: &'a BTreeMap<String, String>,
    /// Typedefs seen in the source and its local headers, with the file they are in.
    pub typedefs: &'a BTreeMap<String, (Typedef, String)>,
    /// Structs seen, with file and line.
    pub structs: &'a BTreeMap<String, (String, u32)>,
    /// The structs among them that hold one array of device pointers.
    pub tables: &'a BTreeMap<String, PtrTableDecl>,
    /// Integer `#define`s, for a table's array length.
    pub defines: &'a BTreeMap<String, u64>,
    /// The path of the stepgraph runtime (`::stepgraph`).
    pub rt: &'a str,
    /// `sizeof(long)` on the target: 8, or 4 on Windows.
    pub long_bytes: usize,
}

enum Base {
    Rust { path: String, size: Option<usize> },
    Void,
}

/// The Rust side of `p`, or why there is none (a sentence that names the fix).
pub(crate) fn rust_param(p: &ParamSig, env: &TypeEnv<'_>) -> Result<RustParam, String> {
    let spelling = p.words.join(" ");
    if p.stars == 0
        && !env.mappings.contains_key(&spelling)
        && let Some(table) = env.tables.get(&spelling)
    {
        return table_param(&spelling, table, env);
    }
    let (base, extra_stars) = resolve(&p.words, env, 0)?;
    let stars = p.stars + extra_stars;
    match (stars, base) {
        (0, Base::Rust { path, size }) => Ok(RustParam {
            rust: path,
            pass: Pass::Value,
            size,
        }),
        (0, Base::Void) => Err("a `void` parameter".into()),
        (1, Base::Rust { path, .. }) => Ok(RustParam {
            rust: path,
            pass: if p.pointee_const {
                Pass::Buf
            } else {
                Pass::BufMut
            },
            size: Some(DEVICE_POINTER_BYTES),
        }),
        (1, Base::Void) => Err(
            "`void*` has no element type for the launcher's `DeviceBuffer<T>`. Use a typed \
             pointer, or map `void` in build.rs: `Builder::new().rust_type(\"void\", \"u8\")` \
             passes it as a `DeviceBuffer<u8>`"
                .into(),
        ),
        _ => Err(
            "a pointer to a pointer: pass a struct of device addresses by value (mapped with \
             `Builder::rust_type`), or the address as `unsigned long long`"
                .into(),
        ),
    }
}

/// A pointer table by value: its element type, and its slots from a literal or a `#define`.
fn table_param(name: &str, t: &PtrTableDecl, env: &TypeEnv<'_>) -> Result<RustParam, String> {
    let slots = t
        .slots
        .parse::<usize>()
        .ok()
        .or_else(|| {
            env.defines
                .get(&t.slots)
                .and_then(|&v| usize::try_from(v).ok())
        })
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            format!(
                "`{name}` holds an array of `{}` pointers: expected a positive decimal length or \
                 an integer `#define` of the source or its quoted includes",
                t.slots
            )
        })?;
    let rust = match resolve(&t.words, env, 0)? {
        (Base::Rust { path, .. }, 0) => path,
        _ => {
            return Err(format!(
                "`{name}` holds pointers to `{}`, which has no Rust element type: use a typed \
                 pointer, or map the struct with `Builder::rust_type`",
                t.words.join(" ")
            ));
        }
    };
    Ok(RustParam {
        rust,
        pass: Pass::Table {
            slots,
            write: !t.pointee_const,
        },
        size: Some(slots * DEVICE_POINTER_BYTES),
    })
}

/// A device pointer, as the driver passes it (`CUdeviceptr`).
pub(crate) const DEVICE_POINTER_BYTES: usize = 8;

fn resolve(words: &[String], env: &TypeEnv<'_>, depth: usize) -> Result<(Base, usize), String> {
    let spelling = words.join(" ");
    if let Some(path) = env.mappings.get(&spelling) {
        return Ok((
            Base::Rust {
                path: path.clone(),
                size: None,
            },
            0,
        ));
    }
    if spelling == "void" {
        return Ok((Base::Void, 0));
    }
    if let Some((path, size)) = builtin(words, env) {
        return Ok((
            Base::Rust {
                path,
                size: Some(size),
            },
            0,
        ));
    }
    if let [word] = words
        && let Some((def, _)) = env.typedefs.get(word)
        && depth < 8
    {
        let (base, stars) = resolve(&def.words, env, depth + 1)?;
        return Ok((base, stars + def.stars));
    }
    let fix = format!(
        "map it to a Rust type of the same size and layout in build.rs: \
         `Builder::new().rust_type(\"{spelling}\", \"crate::{}\")`",
        rust_guess(&spelling)
    );
    if let Some((file, line)) = env.structs.get(&spelling) {
        return Err(format!(
            "`{spelling}` is a struct ({file}:{line}) passed by value, which stepgraph-build \
             cannot lay out. Declare a `#[repr(C)]` Rust struct with the same fields, \
             `unsafe impl stepgraph::DeviceRepr` for it, and {fix}"
        ));
    }
    Err(format!(
        "`{spelling}` is not a type stepgraph-build knows (the built-in types, the \
         <stdint.h> integers, size_t, __half, __nv_bfloat16, and typedefs of them in the \
         source or its quoted includes). If it is a struct, a macro or a typedef it cannot \
         see, {fix}"
    ))
}

fn rust_guess(spelling: &str) -> String {
    spelling
        .rsplit("::")
        .next()
        .unwrap_or(spelling)
        .replace(' ', "")
}

/// The built-in and standard types: Rust path and size.
fn builtin(words: &[String], env: &TypeEnv<'_>) -> Option<(String, usize)> {
    let half = |name: &str| (format!("{}::__rt_v1::{name}", env.rt), 2);
    if let [word] = words {
        let word = word.strip_prefix("std::").unwrap_or(word);
        let named = match word {
            "size_t" => Some(("usize", 8)),
            "ptrdiff_t" | "ssize_t" => Some(("isize", 8)),
            "int8_t" => Some(("i8", 1)),
            "uint8_t" => Some(("u8", 1)),
            "int16_t" => Some(("i16", 2)),
            "uint16_t" => Some(("u16", 2)),
            "int32_t" => Some(("i32", 4)),
            "uint32_t" => Some(("u32", 4)),
            "int64_t" => Some(("i64", 8)),
            "uint64_t" => Some(("u64", 8)),
            _ => None,
        };
        if let Some((rust, size)) = named {
            return Some((rust.to_string(), size));
        }
        match word {
            "__half" | "half" => return Some(half("f16")),
            "__nv_bfloat16" | "nv_bfloat16" => return Some(half("bf16")),
            _ => {}
        }
    }
    if !words.iter().all(|w| BUILTIN_WORDS.contains(&w.as_str())) {
        return None;
    }
    let count = |w: &str| words.iter().filter(|x| *x == w).count();
    let (unsigned, signed) = (count("unsigned"), count("signed"));
    if unsigned + signed > 1 || count("int") > 1 {
        return None;
    }
    let (longs, shorts, chars, ints) = (count("long"), count("short"), count("char"), count("int"));
    let others = words.len() - unsigned - signed - longs - shorts - chars - ints;
    let s = |signed: &str, unsigned_: &str, size: usize| {
        Some((
            (if unsigned == 1 { unsigned_ } else { signed }).to_string(),
            size,
        ))
    };
    match (others, longs, shorts, chars, ints) {
        (1, 0, 0, 0, 0) if unsigned + signed == 0 => match words[0].as_str() {
            "float" => Some(("f32".into(), 4)),
            "double" => Some(("f64".into(), 8)),
            "bool" => Some(("bool".into(), 1)),
            _ => None,
        },
        (0, 0, 0, 1, 0) => match (unsigned, signed) {
            (1, _) => Some(("u8".into(), 1)),
            (_, 1) => Some(("i8".into(), 1)),
            _ => Some(("::core::ffi::c_char".into(), 1)),
        },
        (0, 0, 1, 0, _) => s("i16", "u16", 2),
        (0, 1, 0, 0, _) => s(
            "::core::ffi::c_long",
            "::core::ffi::c_ulong",
            env.long_bytes,
        ),
        (0, 2, 0, 0, _) => s("i64", "u64", 8),
        (0, 0, 0, 0, _) if ints + unsigned + signed > 0 => s("i32", "u32", 4),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lex::lex;
    use crate::parse::{declared, kernels};

    static NO_TABLES: BTreeMap<String, PtrTableDecl> = BTreeMap::new();
    static NO_DEFINES: BTreeMap<String, u64> = BTreeMap::new();

    fn env_with<'a>(
        mappings: &'a BTreeMap<String, String>,
        typedefs: &'a BTreeMap<String, (Typedef, String)>,
        structs: &'a BTreeMap<String, (String, u32)>,
    ) -> TypeEnv<'a> {
        TypeEnv {
            mappings,
            typedefs,
            structs,
            tables: &NO_TABLES,
            defines: &NO_DEFINES,
            rt: "::stepgraph",
            long_bytes: 8,
        }
    }

    fn params(src: &str) -> Vec<ParamSig> {
        let (k, e) = kernels(&lex(src).tokens);
        assert!(e.is_empty(), "{e:?}");
        k.into_iter().next().unwrap().params
    }

    type Mapped = Result<(String, Pass, Option<usize>), String>;

    fn mapped(src: &str, env: &TypeEnv<'_>) -> Vec<Mapped> {
        params(src)
            .iter()
            .map(|p| rust_param(p, env).map(|r| (r.rust, r.pass, r.size)))
            .collect()
    }

    #[test]
    fn every_supported_scalar_maps_to_its_rust_type() {
        let (m, t, s) = Default::default();
        let env = env_with(&m, &t, &s);
        let got: Vec<(String, usize)> = mapped(
            "extern \"C\" __global__ void k(float a, double b, int c, unsigned d, unsigned int e,
             signed f, short g, unsigned short int h, long i, unsigned long j, long long k,
             unsigned long long l, long long int m, char n, signed char o, unsigned char p,
             bool q, size_t r, std::size_t s, int64_t t, uint64_t u, uint32_t v, int32_t w,
             uint8_t x, int8_t y, int16_t z, uint16_t aa, __half ab, __nv_bfloat16 ac, half ad,
             const unsigned ae) {}",
            &env,
        )
        .into_iter()
        .map(|r| {
            let (rust, pass, size) = r.unwrap();
            assert_eq!(pass, Pass::Value);
            (rust, size.unwrap())
        })
        .collect();
        let want: Vec<(&str, usize)> = vec![
            ("f32", 4),
            ("f64", 8),
            ("i32", 4),
            ("u32", 4),
            ("u32", 4),
            ("i32", 4),
            ("i16", 2),
            ("u16", 2),
            ("::core::ffi::c_long", 8),
            ("::core::ffi::c_ulong", 8),
            ("i64", 8),
            ("u64", 8),
            ("i64", 8),
            ("::core::ffi::c_char", 1),
            ("i8", 1),
            ("u8", 1),
            ("bool", 1),
            ("usize", 8),
            ("usize", 8),
            ("i64", 8),
            ("u64", 8),
            ("u32", 4),
            ("i32", 4),
            ("u8", 1),
            ("i8", 1),
            ("i16", 2),
            ("u16", 2),
            ("::stepgraph::__rt_v1::f16", 2),
            ("::stepgraph::__rt_v1::bf16", 2),
            ("::stepgraph::__rt_v1::f16", 2),
            ("u32", 4),
        ];
        let want: Vec<(String, usize)> = want.into_iter().map(|(r, s)| (r.into(), s)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn pointers_become_buffers_by_constness_of_the_pointee() {
        let (m, t, s) = Default::default();
        let env = env_with(&m, &t, &s);
        let got = mapped(
            "extern \"C\" __global__ void k(const float* __restrict__ a, float* b, float* const c, unsigned char const* d, const __half* e) {}",
            &env,
        );
        assert_eq!(
            got,
            vec![
                Ok(("f32".into(), Pass::Buf, Some(8))),
                Ok(("f32".into(), Pass::BufMut, Some(8))),
                Ok(("f32".into(), Pass::BufMut, Some(8))),
                Ok(("u8".into(), Pass::Buf, Some(8))),
                Ok(("::stepgraph::__rt_v1::f16".into(), Pass::Buf, Some(8))),
            ]
        );
    }

    #[test]
    fn typedefs_resolve_and_mappings_take_precedence() {
        let d = declared(&lex("typedef unsigned long long u64; typedef float* fptr;").tokens);
        let typedefs = d
            .typedefs
            .into_iter()
            .map(|(k, v)| (k, (v, "cuda/x.cu".to_string())))
            .collect();
        let mut m = BTreeMap::new();
        m.insert("BranchIn".to_string(), "crate::BranchPtrs".to_string());
        m.insert("void".to_string(), "u8".to_string());
        let s = BTreeMap::new();
        let env = env_with(&m, &typedefs, &s);
        let got = mapped(
            "extern \"C\" __global__ void k(const u64* t, u64 n, fptr x, const BranchIn adv, void* raw) {}",
            &env,
        );
        assert_eq!(
            got,
            vec![
                Ok(("u64".into(), Pass::Buf, Some(8))),
                Ok(("u64".into(), Pass::Value, Some(8))),
                Ok(("f32".into(), Pass::BufMut, Some(8))),
                Ok(("crate::BranchPtrs".into(), Pass::Value, None)),
                Ok(("u8".into(), Pass::BufMut, Some(8))),
            ]
        );
    }

    #[test]
    fn a_struct_without_a_mapping_names_the_fix() {
        let m = BTreeMap::new();
        let t = BTreeMap::new();
        let mut s = BTreeMap::new();
        s.insert("BranchIn".to_string(), ("cuda/common.cuh".to_string(), 24));
        let env = env_with(&m, &t, &s);
        let got = mapped(
            "extern \"C\" __global__ void k(const BranchIn adv, Mystery m, float** pp, void* v, long double ld) {}",
            &env,
        );
        let e: Vec<String> = got.into_iter().map(Result::unwrap_err).collect();
        assert_eq!(
            e[0],
            "`BranchIn` is a struct (cuda/common.cuh:24) passed by value, which stepgraph-build \
             cannot lay out. Declare a `#[repr(C)]` Rust struct with the same fields, `unsafe \
             impl stepgraph::DeviceRepr` for it, and map it to a Rust type of the same size and \
             layout in build.rs: `Builder::new().rust_type(\"BranchIn\", \"crate::BranchIn\")`"
        );
        assert!(
            e[1].starts_with("`Mystery` is not a type stepgraph-build knows"),
            "{}",
            e[1]
        );
        assert!(e[1].ends_with("`Builder::new().rust_type(\"Mystery\", \"crate::Mystery\")`"));
        assert!(e[2].starts_with("a pointer to a pointer"), "{}", e[2]);
        assert!(e[3].starts_with("`void*` has no element type"), "{}", e[3]);
        assert!(e[4].starts_with("`long double` is not a type"), "{}", e[4]);
    }

    #[test]
    fn a_pointer_table_is_passed_as_a_table_unless_mapped() {
        let d = declared(
            &lex("#define MAXB 4\nstruct In { const float* p[MAXB]; };\nstruct Out { float* p[8]; };\nstruct Bad { float* p[NOPE]; };\nstruct Odd { Mystery* p[2]; };").tokens,
        );
        let structs = d
            .structs
            .iter()
            .map(|(k, v)| (k.clone(), ("x.cuh".to_string(), *v)))
            .collect();
        let defines = BTreeMap::from([("MAXB".to_string(), 4u64)]);
        let mut m = BTreeMap::new();
        let t = BTreeMap::new();
        let src = "extern \"C\" __global__ void k(In a, const Out b, Bad c, Odd d, Out e) {}";
        let table = |slots, write| Pass::Table { slots, write };
        {
            let mut env = env_with(&m, &t, &structs);
            env.tables = &d.tables;
            env.defines = &defines;
            let got = mapped(src, &env);
            assert_eq!(got[0], Ok(("f32".into(), table(4, false), Some(32))));
            assert_eq!(got[1], Ok(("f32".into(), table(8, true), Some(64))));
            let bad = got[2].clone().unwrap_err();
            assert!(bad.contains("array of `NOPE` pointers"), "{bad}");
            let odd = got[3].clone().unwrap_err();
            assert!(odd.contains("`Mystery` is not a type"), "{odd}");
        }
        m.insert("Out".to_string(), "crate::OutPtrs".to_string());
        let mut env = env_with(&m, &t, &structs);
        env.tables = &d.tables;
        let got = mapped(src, &env);
        assert_eq!(got[4], Ok(("crate::OutPtrs".into(), Pass::Value, None)));
    }
}
