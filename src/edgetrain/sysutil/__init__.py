"""What edgetrain needs from the operating system beside training: processes tied to their parent."""
