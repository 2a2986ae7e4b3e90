"""elastic/driver/server: the HTTP API, its limits, logins, the Host header, TLS."""
