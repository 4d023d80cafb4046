//! Compiles the vendored `.proto` files under `proto/` into Rust with
//! prost-build, parsed by protox (pure Rust): no `protoc` needed to build.
use std::path::Path;

/// Every `.proto` compiled, relative to `proto/` (also the include root).
/// Add a format's files here and a module for its package in `src/lib.rs`.
const PROTOS: &[&str] = &["pprof/profile.proto", "perfetto/perfetto_trace.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new("proto");
    println!("cargo:rerun-if-changed=build.rs");
    for p in PROTOS {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    let fds = protox::compile(PROTOS, [root])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
