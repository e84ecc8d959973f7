//! Rate limits and quotas on tool calls (issue 76 item 1; docs/governance.md). A call, whichever way it came
//! (`execute_mcp_tool` on `/mcp` or legacy SSE, `tools/call` on `/i/{path}/mcp`), is counted under every rule naming
//! its resolved server and tool before it goes out; one it would exceed refuses it, naming the rule and when to
//! retry. Rates are token buckets in this process; quotas are rows in the database, so they survive a restart and,
//! on PostgreSQL, are shared by the replicas.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Datelike, Duration as Days, TimeZone, Utc};
use parking_lot::{Mutex, RwLock};
use serde_json::json;

use super::{internal, RouteError};
use crate::instances::InstanceManager;
use crate::mcp::protocol::RpcError;
use crate::metrics::Metrics;
use crate::model::{InstanceSpec, LimitRule, Period, Quota, Rate};
use crate::store::LimitUsage;

/// The JSON-RPC code of a call a limit refused (implementation-defined server error range; 429's digits).
pub const RATE_LIMITED: i64 = -32029;

/// A counter: the rule's name, and whose calls (`LimitRule::counter`).
type CounterKey = (String, String);
/// One trip to the database at a time for a counter.
type Trip = Arc<tokio::sync::Mutex<()>>;

/// The rules and their counters; cheap to clone.
#[derive(Clone)]
pub struct Limits {
    inner: Arc<Inner>,
}

struct Inner {
    rules: RwLock<Arc<Vec<LimitRule>>>,
    /// Each rate's bucket, by rule name and counter.
    buckets: Mutex<HashMap<CounterKey, Bucket>>,
    /// Calls of each quota's counter taken from the database ahead and not yet used, by rule name and counter.
    leases: Mutex<HashMap<CounterKey, Lease>>,
    /// One trip to the database at a time per counter: a call that finds the lease empty waits for another's trip
    /// and takes from what it brought, rather than being refused beside calls left in the lease.
    trips: Mutex<HashMap<CounterKey, Trip>>,
    usage: LimitUsage,
    metrics: Option<Metrics>,
}

/// A token bucket: `tokens` as of `at`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn refilled(self, rate: &Rate, now: Instant) -> Bucket {
        let per_second = f64::from(rate.calls) / rate.per.as_secs_f64();
        let tokens = (self.tokens + now.saturating_duration_since(self.at).as_secs_f64() * per_second)
            .min(f64::from(rate.burst));
        Bucket { tokens, at: now }
    }

    /// Whole seconds until one token is there again.
    fn wait(&self, rate: &Rate) -> u64 {
        let per_second = f64::from(rate.calls) / rate.per.as_secs_f64();
        ((1.0 - self.tokens).max(0.0) / per_second).ceil().max(1.0) as u64
    }
}

/// Calls of a quota taken from the database ahead, for `period`: a call takes one here when there is one, and goes
/// to the database (for up to [`lease_size`] more) only when there is none.
#[derive(Debug, Clone)]
struct Lease {
    period: String,
    left: u64,
}

/// How many calls one trip to the database takes ahead: a hundredth of the quota, from 1 to 100. Calls taken ahead
/// count as used: a replica that stops (or a period that ends) with some left loses them, so a quota can fall short
/// by that much per replica and restart, never run over.
fn lease_size(quota: u64) -> u64 {
    (quota / 100).clamp(1, 100)
}

/// Why a call was refused: the rule, what it allows, and when to retry.
struct Refusal<'a> {
    rule: &'a LimitRule,
    allows: String,
    retry_after: u64,
    current: u64,
    limit: u64,
}

impl Limits {
    pub fn new(rules: Vec<LimitRule>, usage: LimitUsage, metrics: Option<Metrics>) -> Limits {
        let inner = Inner {
            rules: RwLock::new(Arc::new(rules)),
            buckets: Mutex::default(),
            leases: Mutex::default(),
            trips: Mutex::default(),
            usage,
            metrics,
        };
        Limits { inner: Arc::new(inner) }
    }

    /// The rules of a configuration applied anew; the buckets of rules still there keep what they hold.
    pub fn replace(&self, rules: Vec<LimitRule>) {
        let names: Vec<String> = rules.iter().map(|r| r.name.clone()).collect();
        self.inner.buckets.lock().retain(|(rule, _), _| names.contains(rule));
        self.inner.leases.lock().retain(|(rule, _), _| names.contains(rule));
        self.inner.trips.lock().retain(|(rule, _), _| names.contains(rule));
        *self.inner.rules.write() = Arc::new(rules);
    }

    /// Count a call of `tool` on `spec`'s instance under every rule naming it, or refuse it (nothing counted).
    pub async fn admit(&self, manager: &InstanceManager, spec: &InstanceSpec, tool: &str) -> Result<(), RouteError> {
        let rules = self.inner.rules.read().clone();
        let counting: Vec<&LimitRule> = rules.iter().filter(|r| r.counts(spec, tool)).collect();
        if counting.is_empty() {
            return Ok(());
        }
        let refused = match self.take_rates(&counting, spec) {
            Err(refusal) => Some(refusal),
            // Boxed, as is the refusal: a database statement's future held inline would grow every call's future
            // (and every POST's) by its size, for rules most calls are not under.
            Ok(()) => match Box::pin(self.take_quotas(&counting, spec)).await {
                Ok(None) => None,
                Ok(Some(refusal)) => {
                    self.give_back_rates(&counting, spec);
                    Some(refusal)
                }
                Err(err) => {
                    self.give_back_rates(&counting, spec);
                    return Err(err);
                }
            },
        };
        let Some(refusal) = refused else { return Ok(()) };
        Err(Box::pin(self.refuse(manager, spec, tool, refusal)).await)
    }

    /// Take a token from every rate's bucket, or from none when one is empty.
    fn take_rates<'a>(&self, counting: &[&'a LimitRule], spec: &InstanceSpec) -> Result<(), Refusal<'a>> {
        let now = Instant::now();
        let mut buckets = self.inner.buckets.lock();
        for rule in counting {
            let Some(rate) = &rule.rate else { continue };
            let key = (rule.name.clone(), rule.counter(spec));
            let full = Bucket { tokens: f64::from(rate.burst), at: now };
            let bucket = buckets.get(&key).copied().unwrap_or(full).refilled(rate, now);
            buckets.insert(key, bucket);
            if bucket.tokens < 1.0 {
                let allows = format!("{} calls per {}s (bursts of {})", rate.calls, rate.per.as_secs(), rate.burst);
                let (current, limit) = (u64::from(rate.burst), u64::from(rate.burst));
                return Err(Refusal { rule, allows, retry_after: bucket.wait(rate), current, limit });
            }
        }
        for rule in counting {
            if rule.rate.is_some() {
                if let Some(bucket) = buckets.get_mut(&(rule.name.clone(), rule.counter(spec))) {
                    bucket.tokens -= 1.0;
                }
            }
        }
        Ok(())
    }

    /// The tokens a call took, given back when a quota then refused it.
    fn give_back_rates(&self, counting: &[&LimitRule], spec: &InstanceSpec) {
        let mut buckets = self.inner.buckets.lock();
        for rule in counting {
            let Some(rate) = &rule.rate else { continue };
            if let Some(bucket) = buckets.get_mut(&(rule.name.clone(), rule.counter(spec))) {
                bucket.tokens = (bucket.tokens + 1.0).min(f64::from(rate.burst));
            }
        }
    }

    /// Take a call from every quota's counter (from its lease, else from the database); when one is spent, give
    /// back what the others took.
    async fn take_quotas<'a>(
        &self,
        counting: &[&'a LimitRule],
        spec: &InstanceSpec,
    ) -> Result<Option<Refusal<'a>>, RouteError> {
        let now = Utc::now();
        let mut taken: Vec<(String, String)> = Vec::new();
        let mut outcome = Ok(None);
        for rule in counting {
            let Some(quota) = &rule.quota else { continue };
            let key = (rule.name.clone(), rule.counter(spec));
            let period = period_of(quota.per, now);
            if self.take_leased(&key, &period) {
                taken.push(key);
                continue;
            }
            let trip = self.inner.trips.lock().entry(key.clone()).or_default().clone();
            let _one_trip = trip.lock().await;
            // Another call's trip may have brought calls while this one waited.
            if self.take_leased(&key, &period) {
                taken.push(key);
                continue;
            }
            match self.inner.usage.take(&rule.name, &key.1, &period, lease_size(quota.calls), quota.calls).await {
                Ok(0) => {
                    let allows = format!("{} calls per {}", quota.calls, period_name(quota));
                    let retry_after = seconds_to_next(quota.per, now);
                    let (current, limit) = (quota.calls, quota.calls);
                    outcome = Ok(Some(Refusal { rule, allows, retry_after, current, limit }));
                }
                Ok(granted) => {
                    self.lease(&key, period, granted - 1);
                    taken.push(key);
                    continue;
                }
                Err(err) => {
                    outcome = Err(internal(format!(
                        "the quota of rule '{}' could not be counted, so the call was not made: {err}",
                        rule.name
                    )));
                }
            }
            break;
        }
        if !matches!(outcome, Ok(None)) {
            for key in &taken {
                self.lease_back(key);
            }
        }
        outcome
    }

    /// One call from the counter's lease for `period`, when it holds one.
    fn take_leased(&self, key: &(String, String), period: &str) -> bool {
        let mut leases = self.inner.leases.lock();
        match leases.get_mut(key) {
            Some(lease) if lease.period == period && lease.left > 0 => {
                lease.left -= 1;
                true
            }
            _ => false,
        }
    }

    /// `left` more calls for the counter's lease (a lease of an earlier period is replaced).
    fn lease(&self, key: &(String, String), period: String, left: u64) {
        let mut leases = self.inner.leases.lock();
        match leases.get_mut(key) {
            Some(lease) if lease.period == period => lease.left += left,
            _ => {
                leases.insert(key.clone(), Lease { period, left });
            }
        }
    }

    /// A call taken for a call another rule then refused, back to its counter's lease.
    fn lease_back(&self, key: &(String, String)) {
        if let Some(lease) = self.inner.leases.lock().get_mut(key) {
            lease.left += 1;
        }
    }

    /// The refusal the client reads: the rule, what it allows, when to retry; counted, and reported once a minute.
    async fn refuse(
        &self,
        manager: &InstanceManager,
        spec: &InstanceSpec,
        tool: &str,
        refusal: Refusal<'_>,
    ) -> RouteError {
        let Refusal { rule, allows, retry_after, current, limit } = refusal;
        let path = format!("{}:{tool}", spec.server_slug);
        if let Some(metrics) = &self.inner.metrics {
            metrics.limit_refusal(&rule.name);
        }
        let message =
            format!("Rate limit exceeded: rule '{}' allows {allows} for {path}; retry in {retry_after}s", rule.name);
        manager.report_limit(spec, current, limit, message.clone()).await;
        let data = json!({"rule": rule.name, "limit": allows, "tool": path, "retryAfterSeconds": retry_after});
        RouteError::Rpc(RpcError::new(RATE_LIMITED, message).with_data(data))
    }
}

/// The period a quota counts in at `now`: `2026-12-06` or `2026-12`.
fn period_of(per: Period, now: DateTime<Utc>) -> String {
    match per {
        Period::Day => now.format("%Y-%m-%d").to_string(),
        Period::Month => now.format("%Y-%m").to_string(),
    }
}

fn period_name(quota: &Quota) -> &'static str {
    match quota.per {
        Period::Day => "day (UTC)",
        Period::Month => "month (UTC)",
    }
}

/// Whole seconds from `now` to the start of the next period.
fn seconds_to_next(per: Period, now: DateTime<Utc>) -> u64 {
    let next = match per {
        Period::Day => now.date_naive().and_hms_opt(0, 0, 0).map(|d| Utc.from_utc_datetime(&d) + Days::days(1)),
        Period::Month => {
            let (year, month) = if now.month() == 12 { (now.year() + 1, 1) } else { (now.year(), now.month() + 1) };
            Utc.with_ymd_and_hms(year, month, 1, 0, 0, 0).single()
        }
    };
    next.map_or(1, |next| u64::try_from((next - now).num_seconds()).unwrap_or(0).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_bucket_refills_evenly_up_to_its_burst_and_says_when_a_token_is_back() {
        let rate = Rate { calls: 10, per: Duration::from_secs(1), burst: 5 };
        let start = Instant::now();
        let empty = Bucket { tokens: 0.0, at: start };
        assert!((empty.refilled(&rate, start + Duration::from_millis(300)).tokens - 3.0).abs() < 1e-6);
        assert_eq!(empty.refilled(&rate, start + Duration::from_secs(60)).tokens, 5.0, "never past the burst");
        assert_eq!(empty.wait(&rate), 1, "a tenth of a second, said as one whole second");
        let slow = Rate { calls: 1, per: Duration::from_secs(60), burst: 1 };
        assert_eq!(Bucket { tokens: 0.5, at: start }.wait(&slow), 30);
    }

    #[test]
    fn a_lease_is_a_hundredth_of_the_quota_from_1_to_100() {
        assert_eq!((lease_size(3), lease_size(2_000), lease_size(1_000_000_000)), (1, 20, 100));
    }

    #[test]
    fn periods_are_calendar_days_and_months_in_utc() {
        let now = Utc.with_ymd_and_hms(2026, 12, 31, 23, 59, 30).single().expect("a time");
        assert_eq!(
            (period_of(Period::Day, now), period_of(Period::Month, now)),
            ("2026-12-31".into(), "2026-12".into())
        );
        assert_eq!(seconds_to_next(Period::Day, now), 30);
        assert_eq!(seconds_to_next(Period::Month, now), 30, "December rolls into the next year");
        let mid = Utc.with_ymd_and_hms(2026, 2, 14, 12, 0, 0).single().expect("a time");
        assert_eq!(seconds_to_next(Period::Month, mid), (14 * 24 + 12) * 3600, "2026 has a 28-day February");
    }
}
