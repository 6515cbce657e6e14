"""Small helpers below every room: storage locations (fs), lazy exports, log lines, memory figures,
the Module's attribute dict."""
