package devices

// IsOwnDevice is isOwnDevice, for the external tests.
var IsOwnDevice = isOwnDevice
