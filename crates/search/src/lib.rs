//! Finding tools: the tantivy index of every instance's tools, queries within a caller's scope, multi-need
//! splitting, the optional semantic stage (feature `semantic`), and o200k token counts of tools and answers. The
//! only crate that names tantivy or the model crates (`invariants_tests`).
//!
//! The floors below are imported under their own names, so a path reads `crate::model::…` as in every crate.

use satellite_model::{memory, model};

pub mod search;
pub mod tokens;
