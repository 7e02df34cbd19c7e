//! The notice targets by name (webhooks and email), each with its own bounded queue and
//! background worker; each delivery runs in its own task (at most [`CONCURRENCY`] per target),
//! so a slow or dead target delays neither the caller nor the other targets.
//!
//! Invariant: [`Targets::send`] never blocks and never fails; a full queue drops the notice
//! (warn log and `emisar_webhook_dropped_total`, labelled with the target's host).

use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::Message;
use super::config::{email_name, webhook_name};
use super::email::{EmailConfig, Mailer};
use crate::server::notices::webhook::{Hook, Settings, WebhookConfig};

/// Notices waiting for one target; past this, new ones are dropped.
pub(crate) const QUEUE: usize = 1024;
/// Deliveries in flight to one target at once.
pub(crate) const CONCURRENCY: usize = 16;

/// How one target delivers.
enum Channel {
    Hook(Hook, reqwest::Client),
    Email(Mailer),
}

impl Channel {
    /// The host logs and metrics name (never a URL or a password).
    fn host(&self) -> &str {
        match self {
            Channel::Hook(hook, _) => &hook.host,
            Channel::Email(mailer) => &mailer.host,
        }
    }

    async fn deliver(&self, notice: &Message, settings: &Settings) -> &'static str {
        match self {
            Channel::Hook(hook, client) => hook.send(client, notice, settings).await,
            Channel::Email(mailer) => mailer.deliver(notice, settings).await,
        }
    }
}

/// One target's queue.
struct Queue {
    name: String,
    host: String,
    tx: mpsc::Sender<Arc<Message>>,
}

/// Hands notices to the targets' workers. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Targets {
    queues: Arc<[Queue]>,
}

impl Targets {
    /// Starts one worker per target on the current tokio runtime. An email target whose
    /// password cannot be read, or whose TLS cannot be set up, is an error naming it.
    pub(crate) fn start(
        hooks: &[WebhookConfig],
        emails: &[EmailConfig],
        shutdown: &CancellationToken,
        settings: Settings,
    ) -> anyhow::Result<Targets> {
        let mut channels = Vec::new();
        if !hooks.is_empty() {
            let client = crate::server::notices::webhook::client(settings.timeout)
                .map_err(|e| anyhow::anyhow!("webhooks: the HTTP client: {}", e.without_url()))?;
            for (i, config) in hooks.iter().enumerate() {
                let hook = Hook::new(config, &format!("webhooks[{i}].url"))?;
                channels.push((webhook_name(i, config), Channel::Hook(hook, client.clone())));
            }
        }
        for (i, config) in emails.iter().enumerate() {
            let mailer = Mailer::new(config, &format!("notices.email[{i}]"), settings.timeout)?;
            channels.push((email_name(i, config), Channel::Email(mailer)));
        }
        let settings = Arc::new(settings);
        let queues = channels
            .into_iter()
            .map(|(name, channel)| {
                let (tx, rx) = mpsc::channel(QUEUE);
                let host = channel.host().to_owned();
                tokio::spawn(worker(
                    rx,
                    Arc::new(channel),
                    settings.clone(),
                    shutdown.clone(),
                ));
                Queue { name, host, tx }
            })
            .collect();
        Ok(Targets { queues })
    }

    /// Whether no target is configured.
    pub(crate) fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }

    /// Queues `notice` for each target named in `names` and returns at once. A target whose
    /// queue is full (or whose worker has stopped) misses it, with a warn log and a metric.
    pub(crate) fn send(&self, names: &[String], notice: Message) {
        let notice = Arc::new(notice);
        for queue in self.queues.iter().filter(|q| names.contains(&q.name)) {
            let reason = match queue.tx.try_send(notice.clone()) {
                Ok(()) => continue,
                Err(mpsc::error::TrySendError::Full(_)) => "queue_full",
                Err(mpsc::error::TrySendError::Closed(_)) => "stopped",
            };
            tracing::warn!(target_name = %queue.name, host = %queue.host, id = %notice.id(), event = notice.event(), reason, "notice dropped");
            crate::server::metrics::webhook_dropped(&queue.host, reason);
        }
    }
}

/// Takes one target's notices in order and starts a delivery for each, at most
/// [`CONCURRENCY`] at once.
async fn worker(
    mut rx: mpsc::Receiver<Arc<Message>>,
    channel: Arc<Channel>,
    settings: Arc<Settings>,
    shutdown: CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(CONCURRENCY));
    loop {
        let notice = tokio::select! {
            _ = shutdown.cancelled() => return,
            notice = rx.recv() => match notice {
                Some(notice) => notice,
                None => return,
            },
        };
        let permit = tokio::select! {
            _ = shutdown.cancelled() => return,
            permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
        };
        let (channel, settings, shutdown) = (channel.clone(), settings.clone(), shutdown.clone());
        tokio::spawn(async move {
            let _permit = permit;
            tokio::select! {
                _ = shutdown.cancelled() => {
                    tracing::warn!(host = %channel.host(), id = %notice.id(), event = notice.event(), "notice delivery abandoned at shutdown");
                }
                outcome = channel.deliver(&notice, &settings) => {
                    crate::server::metrics::webhook_delivery(channel.host(), outcome);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::server::notices::NoticeEvent;
    use crate::server::notices::webhook::WebhookKind;

    fn hook(url: String, name: &str) -> WebhookConfig {
        WebhookConfig {
            name: Some(name.into()),
            url,
            kind: WebhookKind::Generic,
        }
    }

    /// A receiver that keeps the path of every POST.
    async fn receiver() -> (Arc<std::sync::Mutex<Vec<String>>>, String) {
        let seen: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let kept = seen.clone();
        let app = axum::Router::new().route(
            "/{hook}",
            axum::routing::post(move |axum::extract::Path(p): axum::extract::Path<String>| {
                let kept = kept.clone();
                async move {
                    kept.lock().unwrap().push(p);
                    "ok"
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (seen, base)
    }

    #[tokio::test]
    async fn a_notice_goes_to_the_named_targets_only() {
        let (seen, base) = receiver().await;
        let shutdown = CancellationToken::new();
        let targets = Targets::start(
            &[
                hook(format!("{base}/a"), "a"),
                hook(format!("{base}/b"), "b"),
            ],
            &[],
            &shutdown,
            Settings::default(),
        )
        .unwrap();
        targets.send(
            &["b".into()],
            super::super::tests::notice(NoticeEvent::Requested).into(),
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen.lock().unwrap().is_empty() {
            assert!(Instant::now() < deadline, "the hook was not called");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(*seen.lock().unwrap(), ["b"]);
        shutdown.cancel();
    }

    #[tokio::test]
    async fn send_returns_at_once_when_the_hook_hangs() {
        // Accepts connections and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let shutdown = CancellationToken::new();
        let targets =
            Targets::start(&[hook(url, "h")], &[], &shutdown, Settings::default()).unwrap();
        let names = ["h".to_owned()];
        let notice = || -> Message { super::super::tests::notice(NoticeEvent::Requested).into() };
        // Let the worker start every delivery it may; they all hang.
        for _ in 0..(2 * CONCURRENCY) {
            targets.send(&names, notice());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Then past the queue, so the last notices are dropped. A send that waited for room
        // would wait here for good; the bound is liveness only.
        for _ in 0..(QUEUE + 100) {
            let started = Instant::now();
            targets.send(&names, notice());
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "send blocked for {:?}",
                started.elapsed()
            );
        }
        shutdown.cancel();
    }
}
