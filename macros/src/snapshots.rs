//! Snapshot tests of the expansion of three representative steps, pretty-printed and
//! reviewed as code. Regenerate with `STEPGRAPH_BLESS=1 cargo test -p stepgraph-macros`
//! and review the diff like any other change.

use std::path::PathBuf;

use quote::quote;

fn check(name: &str, attr: proc_macro2::TokenStream, item: proc_macro2::TokenStream) {
    let out = crate::expand(attr, item);
    let file: syn::File = syn::parse2(out).expect("the expansion parses as a file");
    let pretty = prettyplease::unparse(&file);
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(format!("{name}.expanded.rs"));
    if std::env::var_os("STEPGRAPH_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &pretty).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "no snapshot at {}: run with STEPGRAPH_BLESS=1 and review it",
            path.display()
        )
    });
    if expected != pretty {
        let first = expected
            .lines()
            .zip(pretty.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(expected.lines().count().min(pretty.lines().count()));
        panic!(
            "expansion of `{name}` changed from line {}:\n  expected: {:?}\n  found:    {:?}\nrun with STEPGRAPH_BLESS=1 and review the diff",
            first + 1,
            expected.lines().nth(first),
            pretty.lines().nth(first)
        );
    }
}

/// Four independent chains on a stream group, joined on the origin.
#[test]
fn fork_join_expansion() {
    check(
        "fork_join",
        quote!(streams(main, chain[4]), kernels = Kernels),
        quote! {
            mod fork_join {
                use super::*;
                #[buffers]
                pub struct Buffers {
                    pub seed: DeviceBuffer<f32>,
                    #[per_branch]
                    pub lanes: [DeviceBuffer<f32>; 4],
                    pub total: DeviceBuffer<f32>,
                }
                #[config]
                pub struct Config { pub iters: u32 }

                fn seed(stream: &CaptureStream<'_>, k: &Kernels, seed: &mut DeviceBuffer<f32>) -> Result<()> {
                    k.fill(stream, seed)
                }
                #[stream(chain[d])]
                fn start(stream: &CaptureStream<'_>, d: usize, seed: &DeviceBuffer<f32>, lanes: &mut DeviceBuffer<f32>) -> Result<()> {
                    stream.copy(seed, lanes)
                }
                #[stream(chain[d])]
                fn work(stream: &CaptureStream<'_>, k: &Kernels, lanes: &mut DeviceBuffer<f32>, iters: u32) -> Result<()> {
                    k.chain_step(stream, lanes, iters)
                }
                #[join(chain)]
                fn sum(stream: &CaptureStream<'_>, k: &Kernels, lanes: &[DeviceBuffer<f32>; 4], total: &mut DeviceBuffer<f32>) -> Result<()> {
                    k.sum(stream, lanes, total)
                }
            }
        },
    );
}

/// Two heads on side streams with per-stream scratch and a cuBLASLt handle.
#[test]
fn scratch_per_stream_expansion() {
    check(
        "scratch_per_stream",
        quote!(streams(main, iqn, attn)),
        quote! {
            pub mod heads {
                use super::*;
                #[buffers]
                pub struct Buffers {
                    pub features: DeviceBuffer<f32>,
                    #[scratch(per_stream)]
                    pub tmp: DeviceBuffer<f32>,
                    pub iqn_out: DeviceBuffer<f32>,
                    pub attn_out: DeviceBuffer<f32>,
                }
                #[config]
                pub struct Config { pub spec: Matmul }

                #[cost(2.0)]
                fn trunk(stream: &CaptureStream<'_>, features: &mut DeviceBuffer<f32>) -> Result<()> {
                    stream.memset_zeros(features)
                }
                #[stream(iqn)]
                fn iqn(blas: &Blas<'_>, features: &DeviceBuffer<f32>, #[out] tmp: &mut DeviceBuffer<f32>, iqn_out: &mut DeviceBuffer<f32>, spec: Matmul) -> Result<()> {
                    blas.run(&spec, features, tmp, iqn_out)
                }
                #[stream(attn)]
                fn attn(stream: &CaptureStream<'_>, features: &DeviceBuffer<f32>, #[out] tmp: &mut DeviceBuffer<f32>, attn_out: &mut DeviceBuffer<f32>) -> Result<()> {
                    stream.copy(features, tmp)?;
                    stream.copy(tmp, attn_out)
                }
            }
        },
    );
}

/// A step with errors: the errors and the stand-in.
#[test]
fn stand_in_expansion() {
    check(
        "stand_in",
        quote!(streams(main, aux)),
        quote! {
            mod broken {
                use super::*;
                #[buffers]
                pub struct Buffers { pub x: DeviceBuffer<f32> }
                #[stream(auxx)]
                fn a(stream: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> { stream.memset_zeros(x) }
                fn a(stream: &CaptureStream<'_>, y: &DeviceBuffer<f32>) -> Result<()> { Ok(()) }
            }
        },
    );
}
