"""Drawing: plain data in (PIL images, numbers, boxes), PNG-ready pictures out. No torch, no model code."""
