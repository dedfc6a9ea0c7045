//! harness (in progress)
