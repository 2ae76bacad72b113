//! Compiles `cuda/*.cu` with stepgraph-build and embeds the compiled images without the
//! stepgraph runtime.
//!
//! This crate is the trainer as it was before stepgraph, so it must not depend on the
//! `stepgraph` crate, and the registry stepgraph-build writes (`$OUT_DIR/migrate_kernels.rs`)
//! names it: that file is written and left unused. The builder is still the one to use: it
//! finds nvcc, honours `STEPGRAPH_CUDA_ARCH` and `NVCC_CCBIN`, checks every kernel's
//! signature against the PTX nvcc wrote, and tracks every source and header for reruns,
//! exactly as for the crates that do use the registry.
//!
//! The builder has no option that hands out the images, but it writes them to
//! `$OUT_DIR/<registry stem>/<module>.<target>.cubin` and `.ptx` (the PTX NUL-terminated for
//! `cuModuleLoadData`; a `.check.ptx` is PTX compiled only for the signature check). This
//! script empties that folder first, so that only this run's images are in it, runs the
//! builder, lists the folder and writes `$OUT_DIR/images.rs`, the table `src/kernels.rs`
//! includes: per module, cubins before PTX and newer targets first, the order the
//! registry's own loader tries them in. Should the layout change, the build fails here
//! with an error that names the folder.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::{env, fs};

/// The registry's file name; its stem names the folder of the images.
const REGISTRY: &str = "migrate_kernels.rs";

fn main() {
    let Some(out_dir) = env::var_os("OUT_DIR").map(PathBuf::from) else {
        println!("cargo::error=OUT_DIR is not set: run this as a build script");
        return;
    };
    let image_dir = out_dir.join(REGISTRY.trim_end_matches(".rs"));
    // Images of an earlier run with other targets must not be embedded.
    if image_dir.exists()
        && let Err(e) = fs::remove_dir_all(&image_dir)
    {
        println!("cargo::error=removing {}: {e}", image_dir.display());
        return;
    }
    stepgraph_build::Builder::new().out_file(REGISTRY).run();
    match image_table(&image_dir) {
        Ok(table) => {
            let path = out_dir.join("images.rs");
            if let Err(e) = fs::write(&path, table) {
                println!("cargo::error=writing {}: {e}", path.display());
            }
        }
        Err(e) => println!("cargo::error={e}"),
    }
}

/// One compiled image: `layers.sm_90.cubin` is module `layers`, target `sm_90`.
struct Image {
    module: String,
    target: String,
    ptx: bool,
    file: String,
}

impl Image {
    fn parse(file: &str) -> Option<Image> {
        let (stem, ptx) = if let Some(s) = file.strip_suffix(".cubin") {
            (s, false)
        } else if let Some(s) = file.strip_suffix(".ptx") {
            (s, true)
        } else {
            return None;
        };
        let (module, target) = stem.split_once('.')?;
        // `<module>.<target>.check.ptx` only served the signature check.
        if target.contains('.') {
            return None;
        }
        Some(Image {
            module: module.to_string(),
            target: target.to_string(),
            ptx,
            file: file.to_string(),
        })
    }

    /// The generation number of `sm_90a` or `compute_100`, for newest-first.
    fn generation(&self) -> u32 {
        let digits: String = self
            .target
            .chars()
            .skip_while(|c| !c.is_ascii_digit())
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().unwrap_or(0)
    }
}

fn image_table(dir: &Path) -> Result<String, String> {
    let none = || {
        format!(
            "no compiled kernels in {}: stepgraph-build failed above, or it no longer writes \
             its images as <module>.<target>.cubin|ptx there (see build.rs)",
            dir.display()
        )
    };
    let entries = fs::read_dir(dir).map_err(|_| none())?;
    let mut images = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("listing {}: {e}", dir.display()))?;
        if let Some(image) = entry.file_name().to_str().and_then(Image::parse) {
            images.push(image);
        }
    }
    if images.is_empty() {
        return Err(none());
    }
    images.sort_by(|a, b| {
        (&a.module, a.ptx, b.generation(), &a.target).cmp(&(
            &b.module,
            b.ptx,
            a.generation(),
            &b.target,
        ))
    });
    let folder = dir.file_name().and_then(|f| f.to_str()).ok_or_else(none)?;
    let mut table = String::from(
        "// Written by build.rs: the images stepgraph-build compiled from cuda/*.cu.\n&[\n",
    );
    for image in &images {
        let _ = writeln!(
            table,
            "    // {}\n    Image {{ module: {:?}, ptx: {}, bytes: include_bytes!(concat!(env!(\"OUT_DIR\"), {:?})) }},",
            image.target,
            image.module,
            image.ptx,
            format!("/{folder}/{}", image.file),
        );
    }
    table.push_str("]\n");
    Ok(table)
}
