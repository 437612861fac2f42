"""Images, one file at a time: how bytes become an upright array of a known mode (decode), a
strict header check (headers), libjpeg-turbo's decode into NumPy (jpeg_turbo) and resizing."""
