-- Replicas sharing one database (issue 18, docs/scale-out.md) each upload events: a replica claims a batch
-- for a lease before sending it, so no other replica sends the same rows; a claim whose lease ran out (its
-- replica died mid-batch) is taken over by the next claimer.
ALTER TABLE event_outbox ADD COLUMN claimed_by TEXT;
ALTER TABLE event_outbox ADD COLUMN claimed_until INTEGER; -- milliseconds since the Unix epoch
