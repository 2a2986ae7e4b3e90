"""What an operator sees of a real job: metrics, stalls, status commands, the page in a browser."""
