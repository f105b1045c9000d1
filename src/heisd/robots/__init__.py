"""Robot-side integrations: a LeRobot policy adapter, the AgileX PIPER control loop."""
