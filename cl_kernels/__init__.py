"""OpenCL C kernel templates (Jinja2) for clmf; shipped as package data."""
