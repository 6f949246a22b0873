//! Compiles the `cadence-kernels` crate (../gpu) to PTX with rustc's own NVPTX backend, once
//! per target, into OUT_DIR; `src/ptx.rs` embeds the results. No CUDA toolkit is needed.
//!
//! The kernel crate is `#![no_core]` on the device (there is no `core` for nvptx64 here), which
//! needs unstable features: RUSTC_BOOTSTRAP=1 allows them for this one invocation of the
//! pinned stable compiler (as the Linux kernel does), so the workspace itself stays on stable.

use std::path::{Path, PathBuf};
use std::process::Command;

/// (name, rustc target-cpu). `portable` is a low baseline the driver JIT-compiles for any newer GPU.
const TARGETS: [(&str, &str); 3] = [("sm_90", "sm_90"), ("sm_120", "sm_120"), ("portable", "sm_75")];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let kernel_src = manifest.join("../gpu/src");
    let lib_rs = kernel_src.join("lib.rs");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());

    for entry in std::fs::read_dir(&kernel_src).expect("read gpu/src") {
        println!("cargo:rerun-if-changed={}", entry.unwrap().path().display());
    }
    println!("cargo:rerun-if-changed=build.rs");

    for (name, cpu) in TARGETS {
        let out = out_dir.join(format!("cadence_kernels_{name}.ptx"));
        compile(&rustc, &lib_rs, cpu, &out);
        let ptx = std::fs::read_to_string(&out).expect("read PTX");
        for kernel in include_str!("../gpu/src/lib.rs")
            .split("KERNEL_NAMES: &str = \"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .expect("KERNEL_NAMES in gpu/src/lib.rs")
            .split_whitespace()
        {
            assert!(ptx.contains(&format!(".entry {kernel}(")), "PTX for {name} lacks kernel {kernel}");
        }
    }
    let version =
        Command::new(&rustc).arg("--version").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    println!("cargo:rustc-env=CADENCE_PTX_RUSTC={}", version.unwrap_or_else(|_| "unknown".into()));
}

fn compile(rustc: &str, lib_rs: &Path, cpu: &str, out: &Path) {
    let status = Command::new(rustc)
        .env("RUSTC_BOOTSTRAP", "1")
        .args(["--edition", "2021", "--crate-type=lib", "--crate-name", "cadence_kernels"])
        .args(["--target", "nvptx64-nvidia-cuda", "--emit=asm", "-O"])
        .arg(format!("-Ctarget-cpu={cpu}"))
        .arg(lib_rs)
        .arg("-o")
        .arg(out)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {rustc} to compile the kernels: {e}"));
    if !status.success() {
        panic!(
            "rustc failed to compile gpu/src to PTX for {cpu}. This needs the toolchain pinned in \
             rust-toolchain.toml (its LLVM has the NVPTX backend)."
        );
    }
}
