"""The browser UI's static files, installed as the `kernel_gateway.web` package."""
