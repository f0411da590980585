"""MC-Diffusion (Masked Conditional Diffusion): mask-and-replace D3PM, VQ image tokens, guidance, CLIPScore."""
