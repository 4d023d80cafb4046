//! What a trace leaves behind: `summary.json` (for tools) and `summary.txt` (for people).
pub mod summary;
pub mod text;

use std::{fs, io, path::Path};

pub use summary::Summary;

/// Writes every output of a recording into `dir`.
pub fn write_all(dir: &Path, s: &Summary) -> io::Result<()> {
    let json = serde_json::to_string_pretty(s).map_err(io::Error::other)?;
    fs::write(dir.join("summary.json"), json + "\n")?;
    fs::write(dir.join("summary.txt"), text::render(s))?;
    Ok(())
}

/// Rebuilds the human outputs of a recorded directory from its `summary.json`.
pub fn rebuild(dir: &Path) -> Result<Summary, String> {
    let path = dir.join("summary.json");
    let data = fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let s: Summary =
        serde_json::from_str(&data).map_err(|e| format!("{} is not a vmtrace summary: {e}", path.display()))?;
    fs::write(dir.join("summary.txt"), text::render(&s)).map_err(|e| format!("cannot write {}: {e}", dir.display()))?;
    Ok(s)
}
