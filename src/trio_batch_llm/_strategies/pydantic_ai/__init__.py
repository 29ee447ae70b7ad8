"""PydanticAI agents as strategies: one ``agent.run`` per attempt, its usage, output and errors mapped."""
