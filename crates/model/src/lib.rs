//! The ground floor: ids, `InstanceSpec`, `InstanceStatus` and its moves, catalogs of tools and resources; secret
//! masking, the allocator's knobs, Prometheus families and named periodic jobs. Every crate above shares these, and
//! this crate uses none of them.

pub mod jobs;
pub mod memory;
pub mod metrics;
pub mod model;
pub mod secrets;

/// The size of the future an `async fn` returns, read from its signature without calling it (tests that keep a
/// hot path's future small): `future_size!(f, <'a> (&'a A, B))`, the arguments' types with their one lifetime.
/// Exported for the unit tests of the crates above (`test-support`), which import it with
/// `#[cfg(test)] #[macro_use] extern crate satellite_model;`.
#[cfg(any(test, feature = "test-support"))]
#[macro_export]
macro_rules! future_size {
    ($f:expr, <$lt:lifetime> ($($arg:ty),* $(,)?)) => {{
        #[allow(clippy::type_complexity)]
        fn size<$lt, Fut>(_: fn($($arg),*) -> Fut) -> usize {
            std::mem::size_of::<Fut>()
        }
        size($f)
    }};
}
