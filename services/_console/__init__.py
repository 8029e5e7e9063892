"""The console: the web page where people decide held calls and watch turns (services/_console/app.py)."""
