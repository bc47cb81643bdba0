//! RabbitMQ's own command-line tool against a node the tests know: what AMQP does not tell (messages a
//! consumer holds unacknowledged, a queue's arguments, every client connection) is read or done with
//! `rabbitmqctl`. The RabbitMQ 4 node runs in a root of its own, where the host's 3.10 tool cannot reach
//! it, so the program is named by the environment beside the node (`scripts/brokers` writes both).

use serde_json::Value;

use super::BoxError;

/// `rabbitmqctl` (or a wrapper that runs a node's own) with the node it talks to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rabbitmqctl {
    /// The program: `rabbitmqctl`, or a path.
    pub program: String,
    /// The node (`-n`), e.g. `eventretry@localhost`.
    pub node: String,
}

impl Rabbitmqctl {
    /// The node in `{prefix}_NODE` and the program in `{prefix}_CTL` (`rabbitmqctl` when unset): for
    /// example `RETRY_TEST_AMQP` (Debian 12's node) or `RETRY_TEST_AMQP4` (RabbitMQ 4's). `None`
    /// without a node.
    pub fn from_env(prefix: &str) -> Option<Rabbitmqctl> {
        let var = |suffix: &str| {
            std::env::var(format!("{prefix}_{suffix}"))
                .ok()
                .filter(|v| !v.is_empty())
        };
        Some(Rabbitmqctl {
            node: var("NODE")?,
            program: var("CTL").unwrap_or_else(|| "rabbitmqctl".to_string()),
        })
    }

    /// Runs `rabbitmqctl -q -n NODE ARGS…`: its standard output, or an error with its standard error.
    pub async fn run(&self, args: &[&str]) -> Result<String, BoxError> {
        let out = tokio::process::Command::new(&self.program)
            .args(["-q", "-n", &self.node])
            .args(args)
            .output()
            .await
            .map_err(|e| format!("run {}: {e}", self.program))?;
        if !out.status.success() {
            return Err(format!(
                "rabbitmqctl {}: {}",
                args.first().unwrap_or(&""),
                String::from_utf8_lossy(&out.stderr).trim()
            )
            .into());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `list_queues` with the given `fields`, one JSON object per queue.
    pub async fn queues(&self, fields: &[&str]) -> Result<Vec<Value>, BoxError> {
        let mut args = vec!["list_queues"];
        args.extend_from_slice(fields);
        args.extend_from_slice(&["--formatter", "json"]);
        let out = self.run(&args).await?;
        Ok(serde_json::from_str(&out).map_err(|e| format!("read list_queues' output: {e}"))?)
    }
}
