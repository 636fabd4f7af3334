"""Op kinds by family; `ir.ops` imports these modules to register them."""
