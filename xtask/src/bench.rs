//! `cargo xtask bench`: filled in below.
use std::path::Path;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Interleaved rounds per variant.
    #[arg(long, default_value_t = 10)]
    pub rounds: usize,
}

pub fn run(_root: &Path, _args: &BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
