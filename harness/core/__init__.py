"""The core path: Case -> inputs and Batch -> compare -> CaseResult, and the engine conventions."""
