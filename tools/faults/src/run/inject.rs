//! Injecting each fault into a run and ending it: kill, stop or restart a process, cut the network,
//! refuse the DLQ, kill a cluster's leader. Apart from the run's counting so that what each fault does
//! reads in one place.

use std::time::{Duration, Instant};

use raw_brokers::{BoxError, RawKafka};

use super::Run;
use crate::faults::Fault;
use crate::outage::OutageHalf;
use crate::process::signal;
use crate::record::now_ms;
use crate::target;

impl Run<'_> {
    /// Injects the fault and ends it.
    pub(super) async fn inject(&mut self, source: &str, dlq: &str) -> Result<(), BoxError> {
        let name = self.target.name;
        match self.fault {
            Fault::ConsumerKill => {
                if self.inbox.is_some() {
                    self.wait_for_held().await?;
                }
                if let Some(c) = &mut self.consumer {
                    c.kill().await?;
                }
                self.start_consumer().await?;
            }
            Fault::BrokerKill => {
                let in_transit = self.target.copies_in_transit().await;
                signal(target::broker_pid(name, None).await?, "KILL").await?;
                match in_transit {
                    Ok(Some(copies)) => self.notes.push(format!(
                        "{} retry copies in the delay ladder at the kill, {} of them held by the \
                         consumer process moving them (rabbitmqctl)",
                        copies.all, copies.held
                    )),
                    Ok(None) => {}
                    Err(e) => self
                        .notes
                        .push(format!("copies in the delay ladder not read: {e}")),
                }
                let restart = Instant::now();
                target::restart_broker(name, &self.log("restart")).await?;
                self.notes.push(format!(
                    "broker back {:.0} s after the kill",
                    restart.elapsed().as_secs_f64()
                ));
            }
            Fault::BrokerStall => {
                let pid = target::broker_pid(name, None).await?;
                signal(pid, "STOP").await?;
                tokio::time::sleep(self.outage).await;
                signal(pid, "CONT").await?;
            }
            Fault::NetworkCut => {
                let namespace = self.namespace.as_ref().ok_or("no namespace")?;
                namespace.cut().await?;
                tokio::time::sleep(self.outage).await;
                namespace.restore().await?;
            }
            Fault::DlqOutage => {
                self.moved
                    .extend(self.target.raw.refuse_dlq_writes(dlq).await?);
                let first_half = self.outage / 2;
                tokio::time::sleep(first_half).await;
                let from = now_ms();
                let waiting_from = self.target.raw.waiting(source, &self.group).await?;
                tokio::time::sleep(self.outage - first_half).await;
                let to = now_ms();
                let waiting_to = self.target.raw.waiting(source, &self.group).await?;
                self.outage_half = Some(OutageHalf {
                    from,
                    to,
                    waiting_from,
                    waiting_to,
                });
                self.moved
                    .extend(self.target.raw.accept_dlq_writes(dlq).await?);
                self.broker
                    .admin()
                    .declare(&self.topic, Some(&self.group))
                    .await?;
            }
            Fault::QueueLeaderKill => {
                let leader = target::rabbitmq_cluster_leader(source, 2).await?;
                if leader == 2 {
                    return Err(
                        "node 2, the consumer's, leads the group's queue: not the fault F7 \
                                means"
                            .into(),
                    );
                }
                signal(target::broker_pid(name, Some(leader)).await?, "KILL").await?;
                let ask = if leader == 3 { 1 } else { 3 };
                let deadline = Instant::now() + Duration::from_secs(60);
                let new_leader = loop {
                    match target::rabbitmq_cluster_leader(source, ask).await {
                        Ok(n) if n != leader => break n,
                        _ if Instant::now() > deadline => {
                            return Err(format!(
                                "no new leader of {source} within 60 s of node {leader}'s kill"
                            )
                            .into());
                        }
                        _ => tokio::time::sleep(Duration::from_millis(500)).await,
                    }
                };
                self.notes.push(format!(
                    "node {leader}, leader of {source} (declared through it), killed; node \
                     {new_leader} leads it now; the consumer, on node 2, went on with two nodes"
                ));
            }
            Fault::LeaderKill => {
                let raw = RawKafka::new(&self.target.url);
                let topic = self.topic.clone();
                let leader = tokio::task::spawn_blocking(move || raw.leader(&topic, 0)).await??;
                let node = u32::try_from(leader)?;
                signal(target::broker_pid(name, Some(node)).await?, "KILL").await?;
                self.notes.push(format!(
                    "node {node}, leader of partition 0, killed; the cluster went on with two"
                ));
            }
        }
        Ok(())
    }
}
