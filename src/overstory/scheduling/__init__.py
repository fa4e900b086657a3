"""`ov schedule`: cron and mail triggers, and the runner of one fire."""
