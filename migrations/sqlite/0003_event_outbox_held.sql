-- An event that cannot be sent as it is (its payload could not be serialised, or its stored row no longer
-- makes an envelope) is kept in the outbox with the reason, never sent and never dropped silently.
ALTER TABLE event_outbox ADD COLUMN held TEXT;
