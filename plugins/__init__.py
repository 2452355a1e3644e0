"""Extension points (Python entry points) and the built-in plugins that use them as a third party would."""
