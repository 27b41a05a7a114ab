//! Cross-crate and end-to-end tests live in tests/.
