"""The sparkring server process: settings, poll loop, driver supervision and the admin CLI."""
