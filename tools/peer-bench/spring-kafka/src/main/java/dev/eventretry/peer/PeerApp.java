package dev.eventretry.peer;

import java.math.BigInteger;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

import org.springframework.beans.factory.annotation.Value;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.kafka.annotation.BackOff;
import org.springframework.kafka.annotation.KafkaListener;
import org.springframework.kafka.annotation.RetryableTopic;
import org.springframework.kafka.retrytopic.RetryTopicHeaders;
import org.springframework.messaging.handler.annotation.Header;
import org.springframework.stereotype.Component;

/**
 * The Spring Kafka side of the peer bench: one {@code @KafkaListener} with {@code @RetryableTopic}, its
 * defaults except the attempts and back-off a workload names, reporting to the bench on standard output
 * in the lines the SDK side prints too:
 *
 * <ul>
 *   <li>{@code PEER late <ms>} for every retry: its start minus the due time spring-kafka wrote in the
 *       record ({@code retry_topic-backoff-timestamp});
 *   <li>{@code PEER done <events> <ms>} once {@code peer.events} events have succeeded, with the time
 *       from the first record to the last success.
 * </ul>
 *
 * An event fails {@code peer.failures} times, then succeeds.
 */
@SpringBootApplication
public class PeerApp {

    public static void main(String[] args) {
        SpringApplication.run(PeerApp.class, args);
    }

    @Component
    static class Listener {

        private final long events;
        private final int failures;
        private final ConcurrentHashMap<String, Integer> attempts = new ConcurrentHashMap<>();
        private final AtomicLong succeeded = new AtomicLong();
        private volatile long firstNanos;

        Listener(@Value("${peer.events}") long events, @Value("${peer.failures:0}") int failures) {
            this.events = events;
            this.failures = failures;
        }

        @RetryableTopic(
                attempts = "${peer.attempts:3}",
                backOff = @BackOff(
                        delayString = "${peer.delay-ms:1000}",
                        multiplierString = "${peer.multiplier:0.0}",
                        maxDelayString = "${peer.max-delay-ms:0}"))
        @KafkaListener(topics = "${peer.topic}", groupId = "${peer.group}")
        public void listen(
                String value,
                @Header(name = RetryTopicHeaders.DEFAULT_HEADER_BACKOFF_TIMESTAMP, required = false)
                        byte[] due) {
            if (firstNanos == 0) {
                firstNanos = System.nanoTime();
            }
            if (due != null) {
                long late = System.currentTimeMillis() - new BigInteger(due).longValue();
                System.out.println("PEER late " + late);
            }
            if (failures > 0 && attempts.merge(value, 1, Integer::sum) <= failures) {
                throw new IllegalStateException("fails on purpose");
            }
            if (succeeded.incrementAndGet() == events) {
                long ms = (System.nanoTime() - firstNanos) / 1_000_000;
                System.out.println("PEER done " + events + " " + ms);
            }
        }
    }
}
