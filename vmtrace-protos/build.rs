//! Generates Rust types for every `.proto` under `proto/` with prost, parsed
//! by protox (pure Rust): no `protoc` binary at build time.
use std::path::{Path, PathBuf};

fn protos(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            protos(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new("proto");
    let mut files = Vec::new();
    protos(root, &mut files)?;
    files.sort();
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(&files, [root])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
