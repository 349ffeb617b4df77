"""What the Rollouts, Quality, Traffic and Events screens draw, as pure functions over the watch stream's
typed views (rows of rich Text, detail blocks): no Textual here, so each is tested without an app."""
