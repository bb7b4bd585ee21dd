//! Client-side rate limiting of Kubernetes API requests (`--kube-api-qps`,
//! `--kube-api-burst`), like client-go's token bucket: up to `burst` requests at
//! once, refilled at `qps` per second. kube-rs has no limiter of its own, and
//! tower's `RateLimitLayer` has no burst, hence this small layer.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

/// A token bucket: holds up to `burst` tokens, refilled at `rate` per second.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket. `rate` must be positive and `burst` at least 1.
    pub fn new(rate: f64, burst: u32, now: Instant) -> Self {
        assert!(rate > 0.0 && rate.is_finite(), "rate must be positive");
        assert!(burst >= 1, "burst must be at least 1");
        let burst = f64::from(burst);
        Self {
            rate,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes one token at `now`, or says how long to wait until one is there.
    pub fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.last = self.last.max(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }
}

/// Wraps a service so that each request first takes a token from a [`TokenBucket`].
#[derive(Clone, Copy, Debug)]
pub struct TokenBucketLayer {
    qps: f64,
    burst: u32,
}

impl TokenBucketLayer {
    /// `qps` requests per second on average, `burst` at once.
    pub fn new(qps: f64, burst: u32) -> Self {
        Self { qps, burst }
    }
}

impl<S> Layer<S> for TokenBucketLayer {
    type Service = TokenBucketService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TokenBucketService {
            inner,
            bucket: TokenBucket::new(self.qps, self.burst, Instant::now()),
            sleep: None,
            permit: false,
        }
    }
}

/// The service made by [`TokenBucketLayer`]. Waiting happens in `poll_ready`, so
/// kube's `Buffer` in front of it queues requests instead of failing them.
pub struct TokenBucketService<S> {
    inner: S,
    bucket: TokenBucket,
    sleep: Option<Pin<Box<Sleep>>>,
    /// A token has been taken for the next `call`.
    permit: bool,
}

impl<S, Req> Service<Req> for TokenBucketService<S>
where
    S: Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.permit {
            if let Some(sleep) = self.sleep.as_mut() {
                ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
            }
            match self.bucket.try_take(Instant::now()) {
                Ok(()) => self.permit = true,
                Err(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        assert!(self.permit, "poll_ready must be called before call");
        self.permit = false;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use tower::ServiceExt;

    use super::*;

    #[test]
    fn bucket_allows_a_burst_then_refills_at_the_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(10.0, 3, start);
        for _ in 0..3 {
            assert_eq!(bucket.try_take(start), Ok(()));
        }
        let wait = bucket.try_take(start).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        // Half a token later, still half a token short.
        let wait = bucket
            .try_take(start + Duration::from_millis(50))
            .unwrap_err();
        assert!((wait.as_secs_f64() - 0.05).abs() < 1e-9, "{wait:?}");
        assert_eq!(bucket.try_take(start + Duration::from_millis(100)), Ok(()));
        // A long pause refills to `burst`, not beyond.
        let later = start + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(bucket.try_take(later), Ok(()));
        }
        assert!(bucket.try_take(later).is_err());
    }

    #[test]
    fn bucket_tolerates_time_going_backwards() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(1.0, 1, start + Duration::from_secs(1));
        assert_eq!(bucket.try_take(start), Ok(()));
        assert!(bucket.try_take(start).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn service_paces_requests_after_the_burst() {
        let inner = tower::service_fn(|n: u32| async move { Ok::<_, Infallible>(n) });
        let mut service = TokenBucketLayer::new(2.0, 2).layer(inner);
        let start = Instant::now();
        let mut done_at = Vec::new();
        for n in 0..5 {
            let out = service.ready().await.unwrap().call(n).await.unwrap();
            assert_eq!(out, n);
            done_at.push(Instant::now() - start);
        }
        let ms: Vec<u128> = done_at.iter().map(Duration::as_millis).collect();
        // Two at once, then one every 500 ms.
        assert_eq!(ms, [0, 0, 500, 1000, 1500]);
    }
}
