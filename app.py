"""CPU GRPO Studio: `python app.py` serves the web app (see grpo_app/ui/app.py for the settings)."""

from grpo_app.ui.app import main

if __name__ == "__main__":
    main()
