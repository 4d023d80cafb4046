//! Protobuf types generated from the vendored `.proto` files (see `build.rs`).

/// Perfetto's trace format (`perfetto.protos`), from
/// `proto/perfetto/perfetto_trace.proto`.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod perfetto {
    include!(concat!(env!("OUT_DIR"), "/perfetto.protos.rs"));
}
