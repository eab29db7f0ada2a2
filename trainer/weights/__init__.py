"""Moving the trainer's weights into the engines: transports and the publisher."""
