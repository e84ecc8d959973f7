-- Like listings of one session, one after another, are one row (issue 19: a row per tools/list cost a listing
-- more than the rest of its answer). `listings` is how many listings a row stands for; its token figures
-- (shown_tokens, visible_tokens, proxy_tokens) become their totals, its tool counts stay those of one. Rows written
-- before stand for one listing each.
ALTER TABLE analytics_listings ADD COLUMN listings INTEGER NOT NULL DEFAULT 1;
