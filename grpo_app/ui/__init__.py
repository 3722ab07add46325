"""The Gradio web app: one builder per tab, a shared Studio, pure renderers and form checks."""
