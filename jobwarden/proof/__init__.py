"""What proves a recovery: replay plans, checkpoint verification and inspection."""
