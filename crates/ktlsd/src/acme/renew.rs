//! When to renew: the renewal time of a certificate and the retry schedule after a
//! failed attempt. Pure arithmetic on times; the task that sleeps and renews is
//! [`super::Acme::renew_forever`].

use std::time::{Duration, SystemTime};

/// When a certificate valid from `not_before` to `not_after` is renewed: two thirds
/// into its lifetime (day 60 of a 90-day certificate), leaving a third for retries.
pub fn renew_at(not_before: SystemTime, not_after: SystemTime) -> SystemTime {
    match not_after.duration_since(not_before) {
        Ok(lifetime) => not_before + lifetime * 2 / 3,
        // A window that ends before it starts is renewed at once.
        Err(_) => not_before,
    }
}

/// The delays between failed renewal attempts: doubling from `FIRST` to at most `MAX`.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
}

impl Backoff {
    pub const FIRST: Duration = Duration::from_secs(60);
    pub const MAX: Duration = Duration::from_secs(6 * 3600);

    pub fn new() -> Self {
        Backoff { next: Self::FIRST }
    }

    /// The delay before the next attempt; each call doubles the one after, up to `MAX`.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        delay
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

/// How long to sleep towards `at`: at most `step`, so that a wall clock that jumps
/// (suspend, a corrected clock) is looked at again within `step`.
pub fn sleep_step(now: SystemTime, at: SystemTime, step: Duration) -> Option<Duration> {
    match at.duration_since(now) {
        Ok(left) if !left.is_zero() => Some(left.min(step)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86400);

    #[test]
    fn renewal_is_two_thirds_into_the_lifetime() {
        let t0 = SystemTime::UNIX_EPOCH + 1000 * DAY;
        for (lifetime, expect) in
            [(90 * DAY, 60 * DAY), (Duration::from_secs(6), Duration::from_secs(4)), (7 * DAY, 7 * DAY * 2 / 3)]
        {
            assert_eq!(renew_at(t0, t0 + lifetime), t0 + expect, "lifetime {lifetime:?}");
        }
        // Backwards window: renew at once (at its start, which is in the past).
        assert_eq!(renew_at(t0 + DAY, t0), t0 + DAY);
    }

    #[test]
    fn backoff_doubles_from_a_minute_to_six_hours() {
        let mut b = Backoff::new();
        let delays: Vec<u64> = (0..12).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(delays, [60, 120, 240, 480, 960, 1920, 3840, 7680, 15360, 21600, 21600, 21600]);
    }

    #[test]
    fn sleeps_are_cut_into_steps_and_end_at_the_target() {
        let now = SystemTime::UNIX_EPOCH + DAY;
        let hour = Duration::from_secs(3600);
        assert_eq!(sleep_step(now, now + 30 * DAY, hour), Some(hour));
        assert_eq!(sleep_step(now, now + Duration::from_secs(5), hour), Some(Duration::from_secs(5)));
        assert_eq!(sleep_step(now, now, hour), None);
        assert_eq!(sleep_step(now, now - hour, hour), None);
    }
}
