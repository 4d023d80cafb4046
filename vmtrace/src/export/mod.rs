//! Files other tools open: sinks of the model, like `report`.
pub mod perfetto;
