//! Builds the kernel programs (`vmtrace-ebpf`) for the BPF target with the nightly
//! toolchain and bpf-linker; the binary embeds the object. `cargo xtask build`
//! installs what this needs first.
use std::path::Path;

fn main() -> anyhow::Result<()> {
    let manifest = std::env::var("CARGO_MANIFEST_DIR")?;
    let root = Path::new(&manifest).join("../vmtrace-ebpf");
    let root = root.to_str().ok_or_else(|| anyhow::anyhow!("non-UTF-8 path {}", root.display()))?;
    // aya-build watches the eBPF crate; the wire types it shares with
    // userspace live in vmtrace-common and must rebuild it too.
    println!("cargo:rerun-if-changed={manifest}/../vmtrace-common");
    // aya-build forwards every line the inner cargo prints to stderr as a
    // `cargo:warning`: progress ("Compiling …") would read as 40 warnings.
    // Compiler diagnostics still come through its JSON message stream.
    std::env::set_var("CARGO_TERM_QUIET", "true");
    let pkg = aya_build::Package { name: "vmtrace-ebpf", root_dir: root, ..Default::default() };
    aya_build::build_ebpf([pkg], aya_build::Toolchain::Nightly).map_err(|e| {
        anyhow::anyhow!(
            "building the eBPF programs failed: {e:#}\n\
             hint: run `cargo xtask build` (it installs nightly rust-src and bpf-linker when missing)"
        )
    })
}
