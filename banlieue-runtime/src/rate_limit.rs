//! Client-side rate limiting of Kubernetes API requests (`--kube-api-qps`,
//! `--kube-api-burst`): a token bucket like client-go's (up to `burst` requests at once,
//! refilled at `qps` per second) whose rate adapts to the apiserver (AIMD, see
//! docs/adr/0016-kube-api-rate-limits.md).
//!
//! The flags are a ceiling. When the apiserver sheds load it answers 429 Too Many
//! Requests (API Priority and Fairness, or the older max-in-flight filter, both with
//! `Retry-After`); each 429 halves the rate, at most once per round of requests (a 429
//! counts only for a request sent after the last decrease), down to [`FLOOR_QPS`]. A 429
//! to a watch does not count: the watch cache answers it while it (re)initializes, e.g.
//! for a CRD just established, which says nothing about load (and the operator opens one
//! watch per kind, not a stream of them). The
//! rate then grows back linearly, by a twentieth of the ceiling per second, so that it
//! is back at the ceiling 10 s after one halving if nothing more is refused.
//!
//! [`KubeApiLayer`] puts it together: kube's own [`RetryPolicy`] (429/503/504, honouring
//! `Retry-After`) outside the limiter, so that every attempt, retries included, takes a
//! token and every 429 reaches the limiter. kube installs that policy below any layer
//! added with `with_layer`, where the limiter would see neither, so
//! [`client::build`](crate::client::build) turns kube's off (`Config::default_retry`).
//! tower's `Retry` needs a `Clone` inner service, hence the `Buffer` below the limiter.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use kube::client::Body;
use kube::client::retry::RetryPolicy;
use tokio::time::{Instant, Sleep};
use tower::buffer::Buffer;
use tower::retry::Retry;
use tower::{BoxError, Layer, Service};

/// The lowest rate the limiter backs off to (client-go's historical default), or the
/// ceiling if that is lower.
pub const FLOOR_QPS: f64 = 5.0;
/// A 429 multiplies the rate by this.
pub const DECREASE: f64 = 0.5;
/// The rate grows back by the ceiling times this, per second.
pub const INCREASE_PER_SECOND: f64 = 0.05;
/// Requests queued between the limiter and kube's HTTP stack.
const BUFFER: usize = 1024;
/// A response header that API Priority and Fairness adds to every response.
const APF_HEADER: &str = "x-kubernetes-pf-prioritylevel-uid";

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

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.last = self.last.max(now);
    }

    /// Takes one token at `now`, or says how long to wait until one is there.
    pub fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }

    /// From `now` on, refills at `rate` up to `burst` (at least 1); tokens above the new
    /// `burst` are dropped.
    pub fn set_rate(&mut self, rate: f64, burst: f64, now: Instant) {
        self.refill(now);
        self.rate = rate;
        self.burst = burst.max(1.0);
        self.tokens = self.tokens.min(self.burst);
    }
}

/// The AIMD controller around the bucket: the rate is `base`, set by the last decrease
/// at `since`, plus [`INCREASE_PER_SECOND`] of the ceiling per second since, up to the
/// ceiling; the bucket's size follows the rate in proportion.
#[derive(Debug)]
pub struct Adaptive {
    bucket: TokenBucket,
    ceiling: f64,
    burst_ceiling: f64,
    floor: f64,
    base: f64,
    since: Instant,
    /// Sequence number of the next request sent.
    next_seq: u64,
    /// 429s for requests numbered below this were answered to a rate already lowered.
    window_start: u64,
    decreases: u64,
}

impl Adaptive {
    /// At the ceiling, `qps` and `burst`, with a full bucket.
    pub fn new(qps: f64, burst: u32, now: Instant) -> Self {
        Self {
            bucket: TokenBucket::new(qps, burst, now),
            ceiling: qps,
            burst_ceiling: f64::from(burst),
            floor: FLOOR_QPS.min(qps),
            base: qps,
            since: now,
            next_seq: 0,
            window_start: 0,
            decreases: 0,
        }
    }

    /// The rate at `now`, requests per second.
    pub fn rate(&self, now: Instant) -> f64 {
        let grown = now.saturating_duration_since(self.since).as_secs_f64()
            * INCREASE_PER_SECOND
            * self.ceiling;
        (self.base + grown).min(self.ceiling)
    }

    /// How many times a 429 has lowered the rate.
    pub fn decreases(&self) -> u64 {
        self.decreases
    }

    fn retune(&mut self, now: Instant) {
        let rate = self.rate(now);
        if rate >= self.ceiling {
            self.base = self.ceiling;
        }
        let burst = self.burst_ceiling * rate / self.ceiling;
        self.bucket.set_rate(rate, burst, now);
    }

    /// Takes a token at `now` and numbers the request, or says how long to wait.
    pub fn try_take(&mut self, now: Instant) -> Result<u64, Duration> {
        if self.base < self.ceiling {
            self.retune(now);
        }
        self.bucket.try_take(now)?;
        let seq = self.next_seq;
        self.next_seq += 1;
        Ok(seq)
    }

    /// Request `seq` was answered 429 at `now`: halves the rate, unless `seq` was sent
    /// before the last decrease (that 429 answered a rate already lowered). Returns the
    /// new rate if it changed.
    pub fn throttled(&mut self, seq: u64, now: Instant) -> Option<f64> {
        if seq < self.window_start {
            return None;
        }
        self.window_start = self.next_seq;
        let before = self.rate(now);
        self.base = (before * DECREASE).max(self.floor);
        self.since = now;
        self.retune(now);
        if self.base < before {
            self.decreases += 1;
            Some(self.base)
        } else {
            None
        }
    }
}

/// What the clones of one [`RateLimited`] share.
#[derive(Debug)]
struct Shared {
    state: Mutex<Adaptive>,
    apf_seen: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Adaptive> {
        // The state stays consistent if a holder panicked; keep limiting.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn observe<B>(&self, seq: u64, watch: bool, response: &Response<B>) {
        if response.status() == StatusCode::TOO_MANY_REQUESTS && !watch {
            let retry_after = response
                .headers()
                .get(http::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_owned();
            let mut state = self.lock();
            let lowered = state.throttled(seq, Instant::now());
            let decreases = state.decreases();
            drop(state);
            if let Some(rate) = lowered {
                tracing::info!(
                    qps = rate,
                    decreases,
                    retry_after,
                    "the apiserver answered 429 Too Many Requests: lowering the client rate"
                );
            }
        }
        if !self.apf_seen.load(Ordering::Relaxed) && response.headers().contains_key(APF_HEADER) {
            self.apf_seen.store(true, Ordering::Relaxed);
            tracing::info!(
                "the apiserver applies API Priority and Fairness (X-Kubernetes-PF-* headers)"
            );
        }
    }
}

/// Wraps a service so that each request first takes a token from an [`Adaptive`] bucket
/// shared by all clones, and each 429 answer lowers its rate.
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
}

impl RateLimitLayer {
    /// `qps` requests per second on average, `burst` at once, at most.
    pub fn new(qps: f64, burst: u32) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(Adaptive::new(qps, burst, Instant::now())),
                apf_seen: AtomicBool::new(false),
            }),
        }
    }

    /// The current rate, requests per second.
    #[cfg(test)]
    pub fn rate(&self) -> f64 {
        self.shared.lock().rate(Instant::now())
    }

    /// How many times a 429 has lowered the rate.
    #[cfg(test)]
    pub fn decreases(&self) -> u64 {
        self.shared.lock().decreases()
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            shared: self.shared.clone(),
            sleep: None,
            permit: None,
        }
    }
}

/// The service made by [`RateLimitLayer`]. Waiting happens in `poll_ready`, so a
/// `Buffer` in front of it queues requests instead of failing them.
pub struct RateLimited<S> {
    inner: S,
    shared: Arc<Shared>,
    sleep: Option<Pin<Box<Sleep>>>,
    /// The sequence number of the token taken for the next `call`.
    permit: Option<u64>,
}

impl<S: Clone> Clone for RateLimited<S> {
    /// A clone shares the bucket but not a token taken by `poll_ready`.
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            sleep: None,
            permit: None,
        }
    }
}

impl<S, B, R> Service<Request<B>> for RateLimited<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<R>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while self.permit.is_none() {
            if let Some(sleep) = self.sleep.as_mut() {
                ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
            }
            match self.shared.lock().try_take(Instant::now()) {
                Ok(seq) => self.permit = Some(seq),
                Err(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let seq = self
            .permit
            .take()
            .expect("poll_ready must be called before call");
        let shared = self.shared.clone();
        let watch = is_watch(&req);
        let response = self.inner.call(req);
        Box::pin(async move {
            let result = response.await;
            if let Ok(response) = &result {
                shared.observe(seq, watch, response);
            }
            result
        })
    }
}

/// Whether `req` is a watch (`?watch=true`, as kube and client-go send it).
fn is_watch<B>(req: &Request<B>) -> bool {
    req.uri()
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"))
}

/// The Kubernetes client's middleware: kube's [`RetryPolicy`] around the adaptive
/// [`RateLimited`] bucket around (a `Buffer` of) kube's HTTP stack.
#[derive(Clone, Debug)]
pub struct KubeApiLayer {
    limit: RateLimitLayer,
}

impl KubeApiLayer {
    /// At most `qps` requests per second on average and `burst` at once.
    pub fn new(qps: f64, burst: u32) -> Self {
        Self {
            limit: RateLimitLayer::new(qps, burst),
        }
    }

    /// The limiter, e.g. for its current rate.
    #[cfg(test)]
    pub fn limit(&self) -> &RateLimitLayer {
        &self.limit
    }
}

/// The service [`KubeApiLayer`] makes of `S`.
pub type KubeApiService<S> =
    Retry<RetryPolicy, RateLimited<Buffer<Request<Body>, <S as Service<Request<Body>>>::Future>>>;

impl<S, R> Layer<S> for KubeApiLayer
where
    S: Service<Request<Body>, Response = Response<R>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send + Sync,
{
    type Service = KubeApiService<S>;

    /// Spawns the buffer's worker: call within a Tokio runtime.
    fn layer(&self, inner: S) -> Self::Service {
        let buffered = Buffer::new(inner, BUFFER);
        Retry::new(RetryPolicy::server_retry(), self.limit.layer(buffered))
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::AtomicUsize;

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

    #[test]
    fn a_lower_rate_drops_the_tokens_above_its_burst() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(100.0, 10, start);
        bucket.set_rate(10.0, 2.0, start);
        assert!(bucket.try_take(start).is_ok());
        assert!(bucket.try_take(start).is_ok());
        let wait = bucket.try_take(start).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn a_429_halves_the_rate_once_per_round_then_it_grows_back() {
        let t0 = Instant::now();
        let mut aimd = Adaptive::new(500.0, 1000, t0);
        assert!(close(aimd.rate(t0), 500.0));
        // Three requests in flight when the apiserver starts refusing.
        let sent: Vec<u64> = (0..3).map(|_| aimd.try_take(t0).unwrap()).collect();
        assert_eq!(aimd.throttled(sent[0], t0), Some(250.0));
        // Their 429s are one signal, not three.
        assert_eq!(aimd.throttled(sent[1], t0), None);
        assert_eq!(aimd.throttled(sent[2], t0), None);
        assert!(close(aimd.rate(t0), 250.0));
        // A request sent after the decrease, refused too, halves again.
        let later = aimd.try_take(t0).unwrap();
        assert_eq!(aimd.throttled(later, t0), Some(125.0));
        assert_eq!(aimd.decreases(), 2);
        // Back by 5 % of the ceiling (25 qps) per second, capped at the ceiling.
        assert!(close(aimd.rate(t0 + Duration::from_secs(2)), 175.0));
        assert!(close(aimd.rate(t0 + Duration::from_secs(60)), 500.0));
    }

    #[test]
    fn the_rate_stops_at_the_floor() {
        let t0 = Instant::now();
        let mut aimd = Adaptive::new(20.0, 1000, t0);
        for _ in 0..10 {
            let seq = aimd.try_take(t0).unwrap();
            aimd.throttled(seq, t0);
        }
        assert!(close(aimd.rate(t0), FLOOR_QPS));
        // 20 → 10 → 5: two decreases, then the floor holds.
        assert_eq!(aimd.decreases(), 2);
        // A ceiling below the floor is its own floor.
        let mut low = Adaptive::new(2.0, 1, t0);
        let seq = low.try_take(t0).unwrap();
        assert_eq!(low.throttled(seq, t0), None);
        assert!(close(low.rate(t0), 2.0));
    }

    #[test]
    fn the_burst_shrinks_with_the_rate() {
        let t0 = Instant::now();
        let mut aimd = Adaptive::new(100.0, 8, t0);
        let seq = aimd.try_take(t0).unwrap();
        aimd.throttled(seq, t0);
        // Rate 50, burst 4: the full bucket of 7 left keeps only 4.
        for _ in 0..4 {
            assert!(aimd.try_take(t0).is_ok());
        }
        assert!(aimd.try_take(t0).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn service_paces_requests_after_the_burst() {
        let inner = tower::service_fn(|n: Request<u32>| async move {
            Ok::<_, Infallible>(Response::new(n.into_body()))
        });
        let mut service = RateLimitLayer::new(2.0, 2).layer(inner);
        let start = Instant::now();
        let mut done_at = Vec::new();
        for n in 0..5 {
            let request = Request::new(n);
            let out = service.ready().await.unwrap().call(request).await.unwrap();
            assert_eq!(*out.body(), n);
            done_at.push(Instant::now() - start);
        }
        let ms: Vec<u128> = done_at.iter().map(Duration::as_millis).collect();
        // Two at once, then one every 500 ms.
        assert_eq!(ms, [0, 0, 500, 1000, 1500]);
    }

    /// A fake apiserver: answers 429 with `Retry-After: 1` to the first `refuse`
    /// requests, then 200 with the APF header; counts the requests.
    fn fake_apiserver(
        refuse: usize,
        seen: Arc<AtomicUsize>,
    ) -> impl Service<
        Request<Body>,
        Response = Response<Body>,
        Error = BoxError,
        Future: Send + 'static,
    > + Send
    + 'static {
        tower::service_fn(move |_: Request<Body>| {
            let n = seen.fetch_add(1, Ordering::SeqCst);
            async move {
                // Some latency, so that concurrent requests are all sent before any answer.
                tokio::time::sleep(Duration::from_millis(10)).await;
                let response = if n < refuse {
                    Response::builder()
                        .status(StatusCode::TOO_MANY_REQUESTS)
                        .header(http::header::RETRY_AFTER, "1")
                        .body(Body::empty())
                } else {
                    Response::builder()
                        .header(APF_HEADER, "8a4a5cb8-0000-0000-0000-000000000000")
                        .body(Body::empty())
                };
                Ok(response?)
            }
        })
    }

    fn get() -> Request<Body> {
        Request::get("/api/v1/namespaces")
            .body(Body::empty())
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_is_retried_after_retry_after_and_lowers_the_rate() {
        let seen = Arc::new(AtomicUsize::new(0));
        let layer = KubeApiLayer::new(500.0, 1000);
        let mut client = layer.layer(fake_apiserver(1, seen.clone()));
        let start = Instant::now();
        let response = client.ready().await.unwrap().call(get()).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        // Refused once, retried once, after the server's Retry-After.
        assert_eq!(seen.load(Ordering::SeqCst), 2);
        assert!(Instant::now() - start >= Duration::from_secs(1));
        assert_eq!(layer.limit().decreases(), 1);
        // 250 qps at the 429, grown back by 25 qps/s for the second since.
        let rate = layer.limit().rate();
        assert!((250.0..=280.0).contains(&rate), "{rate}");
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(close(layer.limit().rate(), 500.0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_to_a_watch_is_retried_but_leaves_the_rate() {
        // The watch cache answers 429 "storage is (re)initializing" to the first watches
        // of a CRD just established: no sign of load.
        let seen = Arc::new(AtomicUsize::new(0));
        let layer = KubeApiLayer::new(500.0, 1000);
        let mut client = layer.layer(fake_apiserver(1, seen.clone()));
        let watch =
            Request::get("/apis/banlieue.io/v1alpha1/providers?&watch=true&timeoutSeconds=290")
                .body(Body::empty())
                .unwrap();
        let response = client.ready().await.unwrap().call(watch).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(seen.load(Ordering::SeqCst), 2);
        assert_eq!(layer.limit().decreases(), 0);
        assert!(close(layer.limit().rate(), 500.0));
        assert!(!is_watch(
            &Request::get("/api/v1/pods?watchy=true").body(()).unwrap()
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_take_tokens_too() {
        // One token a second and no burst: the retry waits for its token, the first
        // request after it for another.
        let seen = Arc::new(AtomicUsize::new(0));
        let layer = KubeApiLayer::new(1.0, 1);
        let mut client = layer.layer(fake_apiserver(1, seen.clone()));
        let start = Instant::now();
        client.ready().await.unwrap().call(get()).await.unwrap();
        client.ready().await.unwrap().call(get()).await.unwrap();
        assert_eq!(seen.load(Ordering::SeqCst), 3);
        // Attempts at 0 s (429), 1 s (Retry-After; token refilled), 2 s.
        let elapsed = Instant::now() - start;
        assert!(
            elapsed >= Duration::from_secs(2) && elapsed < Duration::from_secs(3),
            "{elapsed:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_429s_count_once() {
        let seen = Arc::new(AtomicUsize::new(0));
        let layer = KubeApiLayer::new(100.0, 100);
        let client = layer.layer(fake_apiserver(10, seen.clone()));
        let requests = (0..10).map(|_| {
            let client = client.clone();
            async move { client.oneshot(get()).await }
        });
        for response in futures_join_all(requests).await {
            assert_eq!(response.unwrap().status(), StatusCode::OK);
        }
        assert_eq!(seen.load(Ordering::SeqCst), 20);
        // Ten 429s to requests sent together: one halving.
        assert_eq!(layer.limit().decreases(), 1);
    }

    /// Awaits all of `futures` (spawned, so that they run concurrently).
    async fn futures_join_all<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let handles: Vec<_> = futures.map(tokio::spawn).collect();
        let mut out = Vec::new();
        for handle in handles {
            out.push(handle.await.unwrap());
        }
        out
    }
}
