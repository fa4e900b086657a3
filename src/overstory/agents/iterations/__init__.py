"""`ov loop`: an agent in iterations (fresh sessions) until its check agrees it is done."""
