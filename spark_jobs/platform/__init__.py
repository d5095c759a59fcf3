"""Running the platform on one machine: process supervision for `rulectl up`."""
